"""The sink interface and what every store shares (docs/reference/sinks.md).

A store is a class meeting ``VectorSink`` (``embedline.protocols``; stores need not inherit).
This module adds what they all use: the default table name, the metadata embedline writes
beside a table it creates, the check that refuses to mix vectors of another model or length
(or other kept columns) in one table, the ``(rows, d)`` matrix of an upsert batch, and the
kept columns' part of the held key (``KEPT_HASH``, ``kept_hashes``, ``held_key_columns``):
a store with kept columns writes ``kept_hashes`` of each row beside its values and returns
that column from ``held_keys``, so a metadata-only change is loaded like a text change.

Imports go one way: each store module (``lancedb``, ``pgvector``) imports this one, and the
factory (``adapters.sinks.factory``) imports the stores lazily; this module imports neither.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from embedline.errors import FatalError
from embedline.protocols import SinkColumns, SinkTable
from embedline.template import kept_sha256

__all__ = [
    "DEFAULT_TABLE",
    "KEPT_HASH",
    "OWN_COLUMNS",
    "SINK_FORMAT",
    "KeptColumnsCache",
    "check_compatible",
    "exact_top_k",
    "extra_values",
    "held_key_columns",
    "kept_hashes",
    "sink_columns_of",
    "sink_metadata",
    "sink_table_from_metadata",
    "vector_matrix",
]

DEFAULT_TABLE = "embeddings"  # the table a sink URI without ``table=NAME`` names
SINK_FORMAT = "embedline.sink.v1"
#: The column of each row's ``template.kept_sha256`` in a table with kept columns.
KEPT_HASH = "kept_sha256"
#: Every sink table's own columns (kept columns may not take these names: RunSettings).
OWN_COLUMNS = ("id", "embedding", "text_sha256", "run_key")


def sink_metadata(
    *, embedder: str, model: str, dimensions: int, columns: SinkColumns = SinkColumns()
) -> str:
    """The JSON a sink table carries about its vectors (a LanceDB schema metadata value, a
    PostgreSQL table comment): ``kept_columns`` and ``keep_text`` only when it has them,
    so a plain table's metadata holds only ``format``, ``embedder``, ``model`` and
    ``dimensions``."""
    meta: dict[str, Any] = {
        "format": SINK_FORMAT,
        "embedder": embedder,
        "model": model,
        "dimensions": dimensions,
    }
    if columns.kept:
        meta["kept_columns"] = list(columns.kept)
    if columns.text:
        meta["keep_text"] = True
    return json.dumps(meta, sort_keys=True)


def sink_columns_of(manifest: dict[str, Any]) -> SinkColumns:
    """The ``SinkColumns`` a run's manifest asks for (none for older manifests)."""
    return SinkColumns(
        tuple(str(c) for c in manifest.get("kept_columns") or ()), bool(manifest.get("keep_text"))
    )


def kept_hashes(table: pa.Table, kept: Sequence[str]) -> pa.Array:
    """Each row's ``template.kept_sha256`` of its values in the ``kept`` columns (strings;
    a column ``table`` lacks counts as null): the chunk key's and the held key's part."""
    values = [
        table.column(c).to_pylist() if c in table.column_names else [None] * table.num_rows
        for c in kept
    ]
    if not values:
        return pa.array([], type=pa.string())
    return pa.array([kept_sha256(row) for row in zip(*values, strict=True)], type=pa.string())


def held_key_columns(columns: SinkColumns) -> list[str]:
    """The columns a load compares between the run and the sink (docs/reference/sinks.md)."""
    return ["id", "text_sha256"] + ([KEPT_HASH] if columns.kept else [])


def extra_values(rows: pa.Table, columns: SinkColumns) -> dict[str, list[Any]]:
    """The values a store writes beside embedline's own columns, by column: ``kept_sha256``
    (with kept columns) and each of ``columns.names`` (null where the batch lacks one).

    :raises FatalError: the batch lacks a kept column the table has (a chunk object of
        another run than the table's columns allow).
    """
    missing = [c for c in columns.names if c not in rows.column_names]
    if missing:
        raise FatalError(
            f"the rows to load have no column {missing[0]!r}, which the sink "
            "table keeps: load a run made with the same --keep-columns"
        )
    out: dict[str, list[Any]] = {}
    if columns.kept:
        out[KEPT_HASH] = kept_hashes(rows, columns.kept).to_pylist()
    for name in columns.names:
        out[name] = rows.column(name).to_pylist()
    return out


def sink_table_from_metadata(text: str | bytes | None, *, dimensions: int, rows: int) -> SinkTable:
    """Parse ``sink_metadata`` JSON (None or foreign text: a table embedline did not create)."""
    try:
        meta: Any = json.loads(text) if text else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != SINK_FORMAT:
        return SinkTable(None, None, dimensions, rows)
    return SinkTable(
        str(meta.get("embedder")), str(meta.get("model")), dimensions, rows, sink_columns_of(meta)
    )


def check_compatible(
    found: SinkTable,
    *,
    where: str,
    model: str,
    dimensions: int,
    columns: SinkColumns = SinkColumns(),
    called: str = "table",
) -> None:
    """Refuse to mix vectors of another length or model in one table, or to load a run
    keeping other columns than the table was created with. ``called``: what the store calls
    a table, which is also its URI parameter (``collection`` for Qdrant).

    :raises FatalError: naming both the table's and the run's model and dimensions (or
        kept columns).
    """
    another = f"load into another {called} (?{called}=NAME)"
    if found.dimensions != dimensions or found.model not in (None, model):
        raise FatalError(
            f"{where} holds {found.dimensions}-dimension vectors of model "
            f"{found.model or 'unknown'}, but this run has {dimensions}-dimension vectors of "
            f"model {model}: {another} or drop that one"
        )
    if found.embedder is not None and found.columns != columns:
        raise FatalError(
            f"{where} keeps {found.columns.describe()}, but this run keeps "
            f"{columns.describe()}: {another}, drop that one, "
            f"or run with the {called}'s --keep-columns/--keep-text"
        )


def vector_matrix(rows: pa.Table) -> np.ndarray:
    """The ``embedding`` column of an upsert batch as a ``(rows.num_rows, d)`` array.

    ``rows`` has ``embedding`` as ``fixed_size_list<float>[d]``; the values are not checked
    (each store refuses what it cannot store, e.g. NaN or infinity).
    """
    dims = rows.schema.field("embedding").type.list_size
    flat = rows.column("embedding").combine_chunks().flatten()
    matrix: np.ndarray = flat.to_numpy(zero_copy_only=False).reshape(-1, dims)
    return matrix


def exact_top_k(
    matrix: np.ndarray,
    ids: Sequence[Any],
    vector: np.ndarray,
    k: int,
    values: Sequence[Sequence[Any]] = (),
) -> list[tuple[Any, ...]]:
    """The ``k`` rows of ``matrix`` (float32, rows × d) most cosine-similar to ``vector``
    (d,), as ``(id, similarity, *values)``, most similar first (ties: lower row first);
    ``values`` are columns (one sequence per column, a value per row) returned beside each
    hit. Exact: every row is scored. A zero row scores 0."""
    if not len(ids):
        return []
    vector = np.asarray(vector, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1) * max(float(np.linalg.norm(vector)), 1e-12)
    scores = (matrix @ vector) / np.where(norms == 0, 1, norms)
    k = min(k, len(ids))
    best = np.argpartition(-scores, k - 1)[:k]
    best = best[np.lexsort((best, -scores[best]))]
    return [(ids[i], float(scores[i]), *(column[i] for column in values)) for i in best]


class KeptColumnsCache:
    """The kept columns a store's table was created with, read once from its ``describe()``
    and cached in ``_kept`` (``ensure_table`` sets it; dropping the table clears it)."""

    _kept: SinkColumns | None = None

    def describe(self) -> SinkTable | None:  # defined by each store
        raise NotImplementedError

    def _columns(self) -> SinkColumns:
        """The table's kept columns (none for a table without, or no table yet)."""
        if self._kept is None:
            found = self.describe()
            if found is None:
                return SinkColumns()
            self._kept = found.columns
        return self._kept
