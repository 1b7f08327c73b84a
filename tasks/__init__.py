"""Prefect tasks and the stage logic behind them: plan → embed → publish → record."""

from tasks.chunk import embed_chunk
from tasks.plan import find_published, plan_input

__all__ = ["embed_chunk", "find_published", "plan_input"]
