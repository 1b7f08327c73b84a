"""LanceDB sink: an embedded vector store in a local directory, no server (docs/reference/sinks.md).

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
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from adapters.disk_full import translate_full
from adapters.sinks.base import (
    KEPT_HASH,
    OWN_COLUMNS,
    KeptColumnsCache,
    check_compatible,
    exact_top_k,
    extra_values,
    held_key_columns,
    sink_metadata,
    sink_table_from_metadata,
    vector_matrix,
)
from embedline.errors import FatalError, RetryableError
from embedline.protocols import SinkColumns, SinkTable, UpsertResult

__all__ = ["DEFAULT_KEEP_VERSIONS_S", "LanceDBSink"]

logger = logging.getLogger("embedline")

_META_KEY = b"embedline"
_DELETE_BATCH = 500  # ids per ``delete`` predicate
#: Versions older than this are pruned after each load unless told otherwise (1 hour: no
#: search or load of this table takes that long, so none still reads a pruned version).
DEFAULT_KEEP_VERSIONS_S = 3600.0
_OPTIMIZE_ATTEMPTS = 3
_T = TypeVar("_T")


def _extra_names(columns: SinkColumns) -> list[str]:
    """The table's columns after embedline's own: ``kept_sha256`` with kept columns, then
    the kept columns and ``text``."""
    return ([KEPT_HASH] if columns.kept else []) + list(columns.names)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@contextmanager
def _lance_errors(where: str) -> Iterator[None]:
    """Lance's commit conflicts ("Retryable commit conflict … preempted by concurrent
    transaction") as ``RetryableError``; other errors pass through."""
    try:
        yield
    except (RuntimeError, OSError) as exc:
        if "commit conflict" in str(exc).lower():
            raise RetryableError(
                f"{where}: another writer committed at the same time; rerun "
                "the same command to load the rest"
            ) from exc
        raise


#: An operating system's refusal inside Lance's error text: "…(IO): Permission denied (os
#: error 13), /root/.cargo/…/object_store.rs:1000:21" (the tail is Lance's source line).
_OS_ERROR_RE = re.compile(r"(?:LanceError\(IO\): )?([^:(]*?)\s*\(os error (\d+)\)")


@contextmanager
def _os_refusals(identity: str) -> Iterator[None]:
    """An operating system's refusal of the database directory (permission denied, a file
    where a directory should be, a read-only filesystem; Python's ``OSError`` or Lance's
    ``RuntimeError`` carrying "(os error N)") as one ``FatalError`` naming the sink (exit 3:
    a rerun meets it again until the directory is fixed); a full disk is
    ``translate_full``'s, anything else passes through."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None:
            raise
        raise FatalError(
            f"LanceDB sink {identity}: {exc.strerror} ({exc.filename or ''})"
            "; check that the path is a directory this user can write"
        ) from None
    except RuntimeError as exc:
        found = _OS_ERROR_RE.search(str(exc))
        if found is None or "commit conflict" in str(exc).lower():
            raise
        reason = found[1].strip() or "refused"
        raise FatalError(
            f"LanceDB sink {identity}: {reason} (os error {found[2]}); check that the path is "
            "a directory this user can write"
        ) from None


def _writes(method: Callable[..., _T]) -> Callable[..., _T]:
    """A method that writes the database directory: a full filesystem (Lance raises
    ``RuntimeError("lance error: LanceError(IO): No space left on device (os error 28)")``)
    becomes one ``DiskFullError`` naming the directory (``adapters.disk_full``), another
    refusal of the operating system one ``FatalError`` (``_os_refusals``)."""

    @functools.wraps(method)
    def wrapper(self: LanceDBSink, *args: Any, **kwargs: Any) -> _T:
        with _os_refusals(self.identity), translate_full(self.path, "LanceDB sink directory"):
            return method(self, *args, **kwargs)

    return wrapper


class LanceDBSink(KeptColumnsCache):
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
        self._kept: SinkColumns | None = None  # the table's columns, once read

    def __repr__(self) -> str:
        return f"LanceDBSink({self.identity!r})"

    def _db(self) -> Any:
        import lancedb

        os.makedirs(self.path, exist_ok=True)
        # every read checks for the latest version: a handle kept across loads (a long-lived
        # process) or a table another process wrote never commits on a stale version
        return lancedb.connect(self.path, read_consistency_interval=timedelta(0))

    def _open(self) -> Any:
        if self._table is None:
            with _os_refusals(self.identity):
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
    def ensure_table(
        self, *, embedder: str, model: str, dimensions: int, columns: SinkColumns = SinkColumns()
    ) -> SinkTable:
        """Create the table with embedline's schema if absent (the kept columns and
        ``text`` as strings, ``kept_sha256`` with kept columns); check an existing one.

        :raises FatalError: another length, model or kept columns (``check_compatible``).
        """
        found = self.describe()
        if found is None:
            schema = pa.schema(
                [
                    ("id", pa.string()),
                    ("embedding", pa.list_(pa.float32(), dimensions)),
                    ("text_sha256", pa.string()),
                    ("run_key", pa.string()),
                ]
                + [(name, pa.string()) for name in _extra_names(columns)],
                metadata={
                    _META_KEY: sink_metadata(
                        embedder=embedder, model=model, dimensions=dimensions, columns=columns
                    ).encode()
                },
            )
            self._table = self._db().create_table(self.table_name, schema=schema, exist_ok=True)
            found = self.describe()
            assert found is not None
        self._check_shape(dimensions, found.columns)  # the shape its own metadata names
        check_compatible(
            found,
            where=f"LanceDB table {self.identity}",
            model=model,
            dimensions=dimensions,
            columns=columns,
        )
        self._kept = found.columns
        return found

    def _check_shape(self, dimensions: int, columns: SinkColumns = SinkColumns()) -> None:
        """Refuse a table of another shape before any row is written.

        :raises FatalError: naming each difference (exit 3).
        """
        schema = self._require().schema
        problems = []
        for name in ("id", "text_sha256", "run_key", *_extra_names(columns)):
            if name not in schema.names:
                problems.append(f"no column {name}")
            elif not pa.types.is_string(schema.field(name).type) and not pa.types.is_large_string(
                schema.field(name).type
            ):
                problems.append(f"{name} is {schema.field(name).type}, not string")
        if "embedding" not in schema.names:
            problems.append("no column embedding")
        elif (
            not pa.types.is_fixed_size_list(schema.field("embedding").type)
            or schema.field("embedding").type.value_type != pa.float32()
        ):
            problems.append(
                f"embedding is {schema.field('embedding').type}, not "
                f"fixed_size_list<float>[{dimensions}]"
            )
        extra = [n for n in schema.names if n not in (*OWN_COLUMNS, *_extra_names(columns))]
        problems += [f"column {n} is not one embedline writes" for n in extra]
        if problems:
            raise FatalError(
                f"LanceDB table {self.identity} is not of embedline's shape (id, "
                f"embedding fixed_size_list<float>[{dimensions}], text_sha256, "
                "run_key): " + "; ".join(problems) + ". Load into another table "
                "(?table=NAME) or drop that one"
            )

    def _require(self) -> Any:
        table = self._open()
        if table is None:
            raise FatalError(f"LanceDB table {self.identity} does not exist")
        return table

    @_writes
    def upsert(self, rows: pa.Table, *, run_key: str) -> UpsertResult:
        """Insert or replace ``rows`` by id (one commit); rows LanceDB refuses for good (a
        NaN or infinite vector value: "Vector column 'embedding' has NaNs") are left out,
        listed, and removed from the table if an earlier run wrote them. Lance stores any
        id string (NUL bytes and 12,000-character ids included: measured)."""
        if rows.num_rows == 0:
            return UpsertResult(0)
        finite = np.isfinite(vector_matrix(rows)).all(axis=1)
        ids = rows.column("id").to_pylist()
        refused = tuple(
            (
                i,
                ids[i],
                "non_finite_vector",
                None,
                "the vector holds NaN or infinity, which LanceDB refuses",
            )
            for i in np.flatnonzero(~finite)
        )
        good = rows.filter(pa.array(finite)) if refused else rows
        data = good.select(["id", "embedding", "text_sha256"]).append_column(
            "run_key", pa.array([run_key] * good.num_rows, type=pa.string())
        )
        for name, values in extra_values(good, self._columns()).items():
            data = data.append_column(name, pa.array(values, type=pa.string()))
        with self._lock, _lance_errors(f"upsert into {self.identity}"):
            table = self._require()
            if good.num_rows:
                data = data.cast(table.schema.remove_metadata())
                (
                    table.merge_insert("id")
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute(data)
                )
        if refused:
            self.delete_ids([r[1] for r in refused])
        return UpsertResult(good.num_rows, tuple((int(i), *rest) for i, *rest in refused))

    @_writes
    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete rows whose id is in ``ids``; return how many rows went."""
        with self._lock:
            table = self._require()
            deleted = 0
            for start in range(0, len(ids), _DELETE_BATCH):
                batch = ids[start : start + _DELETE_BATCH]
                result = table.delete(f"id IN ({', '.join(_quote(i) for i in batch)})")
                deleted += int(result.num_deleted_rows)
            return deleted

    def held_keys(self) -> pa.Table:
        """Every row's ``id`` and ``text_sha256`` (and ``kept_sha256`` with kept columns;
        strings), read from the latest version: what the table holds, the record loads
        decide by (docs/reference/sinks.md). Reads those columns only (about 100 bytes a row, 170
        with kept columns), never the vectors or the kept values."""
        key = held_key_columns(self._columns())
        with self._lock:
            table = self._require()
            # a handle reads the version it last saw: another handle's or process's commits
            # (another load of this table) are seen only after this
            table.checkout_latest()
            held = table.search().select(key).limit(None).to_arrow()
        return held.select(key)

    @_writes
    def delete_other_runs(self, run_key: str) -> int:
        """Delete every row not written by ``run_key``; return how many."""
        with self._lock:
            result = self._require().delete(f"run_key != {_quote(run_key)}")
            return int(result.num_deleted_rows)

    def needs_index(self) -> bool:
        """Never: this store builds no index a load must wait for (``finalize``)."""
        return False

    @_writes
    def finalize(self, *, keep_versions_s: float | None = None) -> str:
        """Compact fragments and prune versions older than ``keep_versions_s`` seconds
        (default ``DEFAULT_KEEP_VERSIONS_S``; the latest version is never pruned), through
        the load's one table handle, after its last write: nothing of the load's own can
        conflict. A commit conflict with another process's write is retried; compaction is
        not needed for correct rows, so if it still conflicts the load warns and goes on.
        Source: LanceTable.optimize(cleanup_older_than=…) (Lance keeps 7 days unless told).
        """
        keep = DEFAULT_KEEP_VERSIONS_S if keep_versions_s is None else keep_versions_s
        # 0 is asked for explicitly here; lancedb warns about exactly 0 (other readers of old
        # versions), so 1 ms stands for it: the same versions go
        keep = max(keep, 0.001)
        with self._lock:
            table = self._require()
            for attempt in range(1, _OPTIMIZE_ATTEMPTS + 1):
                try:
                    table.optimize(cleanup_older_than=timedelta(seconds=keep))
                    return "compacted (searched exactly, no index)"
                except (RuntimeError, OSError, ValueError) as exc:
                    if "conflict" not in str(exc).lower():
                        raise
                    logger.warning(
                        "%s: compaction met a concurrent commit (attempt %d of %d)",
                        self.identity,
                        attempt,
                        _OPTIMIZE_ATTEMPTS,
                    )
                    table.checkout_latest()
            logger.warning(
                "%s: not compacted this time (other writers); the rows are loaded", self.identity
            )
            return "not compacted (other writers)"

    def search(
        self,
        vector: np.ndarray,
        k: int,
        *,
        columns: Sequence[str] = (),
        where: Sequence[tuple[str, str]] = (),
        exact: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Cosine search: up to ``k`` ``(id, similarity, *values of columns)``, most
        similar first, among the rows whose ``where`` columns equal their values. Exact (a
        flat search) unless someone built a vector index on the table (embedline builds
        none); ``exact`` bypasses such an index too (``bypass_vector_index()``).

        The filter is a Lance prefilter (applied before the flat search, so the hits are
        the true nearest among the matching rows): column names quoted in backticks, values
        as SQL string literals with ``'`` doubled (Lance's parser takes ``%``, ``\\`` and
        ``"`` literally inside them: measured). A column name holding a backtick cannot be
        quoted in Lance's SQL: then the table is scanned and filtered in Arrow."""
        table = self._require()
        if any("`" in name for name, _ in where):
            return self._scanned(np.asarray(vector, dtype=np.float32), k, columns, where)
        query = table.search(
            np.asarray(vector, dtype=np.float32), vector_column_name="embedding"
        ).distance_type("cosine")
        if exact:
            query = query.bypass_vector_index()
        if where:
            query = query.where(
                " AND ".join(f"`{name}` = {_quote(value)}" for name, value in where), prefilter=True
            )
        result = query.select(["id", *columns, "_distance"]).limit(k).to_arrow()
        values = [result.column(c).to_pylist() for c in columns]
        return [
            (i, 1.0 - float(d), *extra)
            for i, d, *extra in zip(
                result.column("id").to_pylist(),
                result.column("_distance").to_pylist(),
                *values,
                strict=True,
            )
        ]

    def _scanned(
        self, vector: np.ndarray, k: int, columns: Sequence[str], where: Sequence[tuple[str, str]]
    ) -> list[tuple[Any, ...]]:
        """``search`` by reading the table and filtering it in Arrow (exact; no SQL)."""
        import pyarrow.compute as pc

        names = list(dict.fromkeys(["id", "embedding", *columns, *(n for n, _ in where)]))
        rows = self._require().to_arrow().select(names)
        for name, value in where:
            rows = rows.filter(pc.equal(rows.column(name), pa.scalar(value, pa.string())))
        return exact_top_k(
            vector_matrix(rows),
            rows.column("id").to_pylist(),
            vector,
            k,
            [rows.column(c).to_pylist() for c in columns],
        )

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors (float32) of ``ids`` that the table holds, by id (one scan
        with an ``IN`` filter; values as SQL string literals)."""
        if not ids:
            return {}
        rows = (
            self._require()
            .search()
            .where(f"id IN ({', '.join(_quote(i) for i in ids)})")
            .select(["id", "embedding"])
            .limit(None)
            .to_arrow()
        )
        matrix = vector_matrix(rows)
        return {str(i): matrix[n] for n, i in enumerate(rows.column("id").to_pylist())}

    def close(self) -> None:
        """Forget the open table (LanceDB holds no connection)."""
        self._table = None
        self._kept = None
