"""embedline's pure core: keys, errors, models, settings and protocols (no Prefect, no I/O).

The CLI lives in the top-level ``cli`` package, above ``flows/``; adapters, tasks, flows and
the CLI import this package, never the reverse — with one exception for users:
``read_embeddings`` and ``read_embeddings_arrow`` (reading a committed run back) are loaded
from ``tasks.load.read_run`` on first use (PEP 562), so ``import embedline`` stays free of I/O
libraries.
"""

import importlib
from typing import TYPE_CHECKING, Any

from embedline.errors import (
    BadResponseError,
    ConflictError,
    EmbedlineError,
    FatalError,
    InputError,
    RateLimitedError,
    RetryableError,
    RetryLaterError,
    RowError,
    RunIncompleteError,
    StopRequestedError,
)
from embedline.keys import chunk_key, request_key, row_key, run_key, text_sha256
from embedline.models import ChunkOutcome, ChunkSpec, DeadLetter, InputPlan, Row
from embedline.protocols import EmbeddingClient, Embeddings, ObjectStore, PutResult
from embedline.summary import RunSummary

if TYPE_CHECKING:
    from embedline.settings import RunSettings

__all__ = [
    "BadResponseError",
    "ChunkOutcome",
    "ChunkSpec",
    "ConflictError",
    "DeadLetter",
    "EmbeddingClient",
    "Embeddings",
    "EmbedlineError",
    "FatalError",
    "InputError",
    "InputPlan",
    "ObjectStore",
    "PutResult",
    "RateLimitedError",
    "RetryLaterError",
    "RetryableError",
    "Row",
    "RowError",
    "RunIncompleteError",
    "RunSettings",
    "RunSummary",
    "StopRequestedError",
    "chunk_key",
    "read_embeddings",
    "read_embeddings_arrow",
    "request_key",
    "row_key",
    "run_key",
    "text_sha256",
]

_LAZY = {
    "RunSettings": "embedline.settings",
    "read_embeddings": "tasks.load.read_run",
    "read_embeddings_arrow": "tasks.load.read_run",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'embedline' has no attribute {name!r}")
