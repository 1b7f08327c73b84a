"""The sink interface and what every store shares (DESIGN §9).

A store is a class meeting ``VectorSink`` (``embedline.protocols``; stores need not inherit).
This module adds what they all use: the default table name, the metadata embedline writes
beside a table it creates, the check that refuses to mix vectors of another model or length
in one table, and the ``(rows, d)`` matrix of an upsert batch.

Imports go one way: each store module (``lancedb``, ``pgvector``) imports this one, and the
factory (``adapters.sinks.factory``) imports the stores lazily; this module imports neither.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from embedline.errors import FatalError
from embedline.protocols import SinkTable, UpsertResult, VectorSink

__all__ = ["DEFAULT_TABLE", "SINK_FORMAT", "SinkTable", "UpsertResult", "VectorSink",
           "check_compatible", "sink_metadata", "sink_table_from_metadata", "vector_matrix"]  # fmt: skip

DEFAULT_TABLE = "embeddings"  # the table a sink URI without ``table=NAME`` names
SINK_FORMAT = "embedline.sink.v1"


def sink_metadata(*, embedder: str, model: str, dimensions: int) -> str:
    """The JSON a sink table carries about its vectors (a LanceDB schema metadata value, a
    PostgreSQL table comment)."""
    return json.dumps({"format": SINK_FORMAT, "embedder": embedder, "model": model,
                       "dimensions": dimensions}, sort_keys=True)  # fmt: skip


def sink_table_from_metadata(text: str | bytes | None, *, dimensions: int, rows: int) -> SinkTable:
    """Parse ``sink_metadata`` JSON (None or foreign text: a table embedline did not create)."""
    try:
        meta: Any = json.loads(text) if text else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != SINK_FORMAT:
        return SinkTable(None, None, dimensions, rows)
    return SinkTable(str(meta.get("embedder")), str(meta.get("model")), dimensions, rows)


def check_compatible(found: SinkTable, *, where: str, model: str, dimensions: int) -> None:
    """Refuse to mix vectors of another length or model in one table.

    :raises FatalError: naming both the table's and the run's model and dimensions.
    """
    if found.dimensions == dimensions and found.model in (None, model):
        return
    raise FatalError(
        f"{where} holds {found.dimensions}-dimension vectors of model {found.model or 'unknown'}"
        f", but this run has {dimensions}-dimension vectors of model {model}: load into "
        "another table (?table=NAME) or drop that one"
    )


def vector_matrix(rows: pa.Table) -> np.ndarray:
    """The ``embedding`` column of an upsert batch as a ``(rows.num_rows, d)`` array.

    ``rows`` has ``embedding`` as ``fixed_size_list<float>[d]``; the values are not checked
    (each store refuses what it cannot store, e.g. NaN or infinity).
    """
    dims = rows.schema.field("embedding").type.list_size
    flat = rows.column("embedding").combine_chunks().flatten()
    return flat.to_numpy(zero_copy_only=False).reshape(-1, dims)
