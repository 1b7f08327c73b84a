"""The ``embed-csv`` and ``load-run`` Prefect flows, and ``flows.run.Run`` they drive.

``embed_csv`` loads lazily (PEP 562): ``flows.run`` stays importable without Prefect's
start-up cost (about 2 s), for the CLI's path that commits a run before Prefect starts.
"""

from __future__ import annotations

import importlib
from typing import Any

from adapters.memory import keep_memory_flat

keep_memory_flat()  # before pyarrow's first allocation in a deployment's process

__all__ = ["embed_csv"]


def __getattr__(name: str) -> Any:
    if name == "embed_csv":
        return importlib.import_module("flows.embed_csv").embed_csv
    raise AttributeError(f"module 'flows' has no attribute {name!r}")
