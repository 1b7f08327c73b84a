"""LanceDB sink: an embedded vector store in a local directory, no server (DESIGN §8).

Upserts use LanceDB's ``merge_insert("id")`` (one atomic commit per call: Lance writes new
data files, then a new table version; a killed writer leaves no half-visible rows). Search is
exact (flat) cosine search, which LanceDB does without an index; ``finalize`` compacts the
small fragments that one-commit-per-chunk loading leaves behind.
Source: https://lancedb.github.io/lancedb/guides/tables/ (merge insert, delete, optimize).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from adapters.disk_full import translate_full
from adapters.sinks import check_compatible, sink_metadata, sink_table_from_metadata
from embedline.errors import FatalError
from embedline.protocols import SinkTable

__all__ = ["LanceDBSink"]

logger = logging.getLogger("embedline")

_META_KEY = b"embedline"
_DELETE_BATCH = 500  # ids per ``delete`` predicate
_T = TypeVar("_T")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _writes(method: Callable[..., _T]) -> Callable[..., _T]:
    """A method that writes the database directory: a full filesystem (Lance raises
    ``RuntimeError("lance error: LanceError(IO): No space left on device (os error 28)")``)
    becomes one ``DiskFullError`` naming the directory (``adapters.disk_full``)."""

    @functools.wraps(method)
    def wrapper(self: LanceDBSink, *args: Any, **kwargs: Any) -> _T:
        with translate_full(self.path, "LanceDB sink directory"):
            return method(self, *args, **kwargs)

    return wrapper


class LanceDBSink:
    """Table ``table`` of the LanceDB database at ``path`` (a directory).

    One commit at a time: Lance resolves concurrent commits by retrying, which wastes the
    work, so ``parallel_loads`` is 1.
    """

    parallel_loads = 1

    def __init__(self, path: str, *, table: str) -> None:
        self.path = path
        self.table_name = table
        self.identity = f"lancedb://{path}?table={table}"
        self._table: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LanceDBSink({self.identity!r})"

    def _db(self) -> Any:
        import lancedb

        os.makedirs(self.path, exist_ok=True)
        return lancedb.connect(self.path)

    def _open(self) -> Any:
        if self._table is None:
            try:
                self._table = self._db().open_table(self.table_name)
            except (FileNotFoundError, ValueError):
                return None
        return self._table

    def describe(self) -> SinkTable | None:
        """Return the table's metadata and row count, or None if it does not exist."""
        table = self._open()
        if table is None:
            return None
        field = table.schema.field("embedding")
        dims = int(getattr(field.type, "list_size", 0) or 0)
        meta = (table.schema.metadata or {}).get(_META_KEY)
        return sink_table_from_metadata(meta, dimensions=dims, rows=table.count_rows())

    @_writes
    def ensure_table(self, *, embedder: str, model: str, dimensions: int) -> SinkTable:
        """Create the table with embedline's schema if absent; check an existing one.

        :raises FatalError: another length or model (``check_compatible``).
        """
        found = self.describe()
        if found is None:
            schema = pa.schema(
                [("id", pa.string()), ("embedding", pa.list_(pa.float32(), dimensions)),
                 ("text_sha256", pa.string()), ("run_key", pa.string())],
                metadata={_META_KEY: sink_metadata(embedder=embedder, model=model,
                                                   dimensions=dimensions).encode()},
            )  # fmt: skip
            self._table = self._db().create_table(self.table_name, schema=schema,
                                                  exist_ok=True)  # fmt: skip
            found = self.describe()
            assert found is not None
        check_compatible(found, where=f"LanceDB table {self.identity}", model=model,
                         dimensions=dimensions)  # fmt: skip
        return found

    def _require(self) -> Any:
        table = self._open()
        if table is None:
            raise FatalError(f"LanceDB table {self.identity} does not exist")
        return table

    @_writes
    def upsert(self, rows: pa.Table, *, run_key: str) -> int:
        """Insert or replace ``rows`` by id (one commit); return the rows written."""
        if rows.num_rows == 0:
            return 0
        data = rows.select(["id", "embedding", "text_sha256"]).append_column(
            "run_key", pa.array([run_key] * rows.num_rows, type=pa.string()))
        with self._lock:
            table = self._require()
            data = data.cast(table.schema.remove_metadata())
            (table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
             .execute(data))  # fmt: skip
        return rows.num_rows

    @_writes
    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete rows whose id is in ``ids``; return how many rows went."""
        with self._lock:
            table = self._require()
            deleted = 0
            for start in range(0, len(ids), _DELETE_BATCH):
                batch = ids[start:start + _DELETE_BATCH]
                result = table.delete(f"id IN ({', '.join(_quote(i) for i in batch)})")
                deleted += int(result.num_deleted_rows)
            return deleted

    def held_keys(self) -> pa.Table:
        """Every row's ``id`` and ``text_sha256`` (strings), read from the latest version:
        what the table holds, the record loads decide by (DESIGN §9). Reads those two
        columns only (about 100 bytes a row), never the vectors."""
        with self._lock:
            table = self._require()
            # a handle reads the version it last saw: another handle's or process's commits
            # (another load of this table) are seen only after this
            table.checkout_latest()
            held = table.search().select(["id", "text_sha256"]).limit(None).to_arrow()
        return held.select(["id", "text_sha256"])

    @_writes
    def delete_other_runs(self, run_key: str) -> int:
        """Delete every row not written by ``run_key``; return how many."""
        with self._lock:
            result = self._require().delete(f"run_key != {_quote(run_key)}")
            return int(result.num_deleted_rows)

    @_writes
    def finalize(self) -> None:
        """Compact fragments and prune old versions (Lance's ``optimize``)."""
        with self._lock:
            self._require().optimize()

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Exact cosine search: up to ``k`` ``(id, similarity)``, most similar first."""
        table = self._require()
        result = (table.search(np.asarray(vector, dtype=np.float32),
                               vector_column_name="embedding")
                  .distance_type("cosine").select(["id", "_distance"]).limit(k).to_arrow())  # fmt: skip
        return [(i, 1.0 - float(d)) for i, d in zip(result.column("id").to_pylist(),
                                                   result.column("_distance").to_pylist(),
                                                   strict=True)]  # fmt: skip

    def close(self) -> None:
        """Forget the open table (LanceDB holds no connection)."""
        self._table = None
