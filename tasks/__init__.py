"""Prefect tasks and the stage logic behind them: plan → embed → publish → record.

Exports load lazily (PEP 562): ``tasks.manifest`` and ``tasks.publish`` stay importable without
Prefect's start-up cost, e.g. by the CLI's no-op rerun check.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["embed_chunk", "find_published", "plan_input"]

_HOMES = {"embed_chunk": "tasks.chunk", "find_published": "tasks.skip", "plan_input": "tasks.plan"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
