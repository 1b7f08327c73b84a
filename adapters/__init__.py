"""Adapters to the outside world: CSV and input sources, embedding clients, object stores, the
ledger. They never import Prefect; they log to ``embedline.*`` loggers.

The names below load on first use (PEP 562), so importing one adapter (``adapters.memory``
first of all, whose settings must precede pyarrow's first allocation) does not import them
all: an eager package init would load pyarrow before the CLI can choose its memory pool.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "plan_csv": "adapters.csv_source",
    "read_chunk": "adapters.csv_chunks",
    "LocalEmbedder": "adapters.embeddings",
    "OpenAIEmbedder": "adapters.embeddings",
    "build_embedder": "adapters.embeddings",
    "open_input": "adapters.input_source",
    "Ledger": "adapters.ledger",
    "LocalDirStore": "adapters.object_store",
    "S3Store": "adapters.object_store",
    "open_store": "adapters.object_store",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'adapters' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
