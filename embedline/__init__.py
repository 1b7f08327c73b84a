"""embedline's pure core: keys, errors, models, settings and protocols (no Prefect, no I/O).

The CLI lives in the top-level ``cli`` package, above ``flows/``; adapters, tasks, flows and
the CLI import this package, never the reverse.
"""

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
from embedline.models import ChunkOutcome, ChunkSpec, DeadLetter, InputPlan, Row, RunSummary
from embedline.protocols import EmbeddingClient, Embeddings, ObjectStore, PutResult
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
    "request_key",
    "row_key",
    "run_key",
    "text_sha256",
]
