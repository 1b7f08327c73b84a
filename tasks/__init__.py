"""The pipeline's stages, one package each, Prefect-free but for one thin ``task.py``:

``plan`` → ``reuse`` → ``embed`` (or ``batch``, the Batch API) → ``publish`` → ``commit`` →
``load``; ``lease`` keeps what a run or a load needs from ``gc``. ``flows/`` drives them.

Exports load lazily (PEP 562): the stage modules stay importable without Prefect's start-up
cost, e.g. by the CLI's no-op rerun check.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["embed_chunk", "find_published", "plan_input"]

_HOMES = {
    "embed_chunk": "tasks.embed.task",
    "find_published": "tasks.plan.published",
    "plan_input": "tasks.plan.task",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
