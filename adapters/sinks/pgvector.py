"""pgvector sink: a PostgreSQL table with a ``vector(d)`` column and an HNSW index
(docs/reference/sinks.md).

Table (created if absent; the comment holds embedline's metadata as JSON)::

    CREATE TABLE t (id text PRIMARY KEY, embedding vector(d) NOT NULL,
                    text_sha256 text NOT NULL, run_key text NOT NULL
                    [, kept_sha256 text, "Kept Column" text, …] [, text text])

Kept columns are ``text`` columns named as in the CSV (quoted with
``psycopg.sql.Identifier``, never pasted into SQL). The index (``finalize``)::

    CREATE INDEX t_embedding_hnsw ON t USING hnsw (embedding vector_cosine_ops)  -- d ≤ 2,000
    CREATE INDEX t_embedding_hnsw ON t
        USING hnsw ((embedding::halfvec(d)) halfvec_cosine_ops)              -- d ≤ 4,000

Each upsert is one transaction: one binary ``COPY`` of the batch into a temporary table
(``ON COMMIT DROP``), then one ``INSERT … SELECT … ON CONFLICT (id) DO UPDATE`` from it into
the table; a row the server refuses is isolated by selecting halves of the same staged rows
in savepoints. Nothing outlives the transaction (no session settings, no prepared
statements: ``prepare_threshold=None``), so a pooler in transaction mode (PgBouncer) may
hand each transaction another server connection. The HNSW index is built after the first
load, not before: pgvector builds it faster over existing rows than row by row (pgvector
README, "HNSW"); HNSW indexes ``vector`` of at most 2,000 dimensions and ``halfvec`` of at
most 4,000, so vectors of 2,001–4,000 dimensions are indexed as ``halfvec`` (searches cast
the same way) and longer ones are searched without an index. Most of an upsert's time into
an indexed table is the index's: each new row version is inserted into the HNSW graph
(``benchmarks/bench_pg_upsert.py``).
The password comes only from libpq's environment (``PGPASSWORD``, ``~/.pgpass``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.sinks.aliases import REGISTRY
from adapters.sinks.base import (
    KEPT_HASH,
    KeptColumnsCache,
    check_compatible,
    extra_values,
    held_key_columns,
    sink_metadata,
    sink_table_from_metadata,
    vector_matrix,
)
from adapters.sinks.pg_errors import (
    describe_columns_sql,
    relkind_sql,
    shape_problems,
    unique_id_sql,
)
from adapters.sinks.pg_errors import translate as _translate
from adapters.sinks.pg_index import (
    HALFVEC_MAX_DIMENSIONS,
    VECTOR_MAX_DIMENSIONS,
    index_build_settings,
    index_method,
    index_state,
    progress_lines,
)
from adapters.sinks.pg_search import filtered_search
from adapters.sinks.pg_upsert import Batch, refused_before_sending, upsert_staged
from embedline.errors import FatalError, RetryableError
from embedline.progress import PROGRESS_LOGGER
from embedline.protocols import SinkColumns, SinkTable, UpsertResult

__all__ = ["HNSW_MAX_DIMENSIONS", "PgVectorSink"]

logger = logging.getLogger("embedline")
progress_logger = logging.getLogger(PROGRESS_LOGGER)  # shown at INFO (embedline.progress)

HNSW_MAX_DIMENSIONS = HALFVEC_MAX_DIMENSIONS  # the longest vectors indexed (as halfvec)


_MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are cut silently


def _extra_names(columns: SinkColumns) -> list[str]:
    """The table's columns after embedline's own: ``kept_sha256`` with kept columns, then
    the kept columns and ``text``."""
    return ([KEPT_HASH] if columns.kept else []) + list(columns.names)


class PgVectorSink(KeptColumnsCache):
    """Table ``table`` in the PostgreSQL database at ``dsn`` (a password-free libpq URI).

    One connection per thread (psycopg connections run one transaction at a time), so
    ``parallel_loads`` chunk loads may run at once.
    """

    parallel_loads = 2
    progress_interval_s = 10.0  # seconds between the index build's progress lines
    #: called with (rows done, rows) at each progress line of an index build; returns at once
    on_progress: Callable[[int, int], None] | None = None

    def __init__(self, dsn: str, *, table: str) -> None:
        self.dsn = dsn
        self.table_name = table
        self.identity = f"{dsn}{'&' if '?' in dsn else '?'}table={table}"
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self._kept: SinkColumns | None = None  # the table's columns, once read

    def __repr__(self) -> str:
        return f"PgVectorSink({self.identity!r})"

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            import psycopg

            try:
                # UTF-8 on the wire whatever the database's encoding: the server then names a
                # character it cannot hold (22P05, a dead letter), not psycopg's encoder
                # no prepared statements: a pooler in transaction mode may run the next
                # transaction on another server connection, where they do not exist
                conn = psycopg.connect(
                    self.dsn,
                    connect_timeout=10,
                    client_encoding="UTF8",
                    prepare_threshold=None,
                )
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.commit()
                from pgvector.psycopg import register_vector

                register_vector(conn)
            except psycopg.Error as exc:
                raise _translate(exc, f"PostgreSQL {self.dsn}") from None
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _transaction(self, what: str) -> Iterator[Any]:
        import psycopg

        conn = self._connection()
        try:
            with conn.transaction():
                yield conn
        except psycopg.Error as exc:
            raise _translate(exc, f"{what} {self.identity}") from exc

    def _ident(self) -> Any:
        from psycopg import sql

        return sql.Identifier(self.table_name)

    def describe(self) -> SinkTable | None:
        """Return the table's metadata and row count, or None if it does not exist."""
        from psycopg import sql

        with self._transaction("describe") as conn:
            shape = self._shape(conn)
            if shape is None:
                return None
            rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._ident()))
            count = int(rows.fetchone()[0])
        dims, comment = shape
        return sink_table_from_metadata(comment, dimensions=dims, rows=count)

    def _shape(self, conn: Any) -> tuple[int, str | None] | None:
        """The embedding column's length (0: not ``vector(N)``) and the relation's comment
        (embedline's metadata), in ``conn``'s transaction; None: no such table or view."""
        row = conn.execute(
            """SELECT format_type(a.atttypid, a.atttypmod), obj_description(c.oid, 'pg_class')
               FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
               WHERE c.oid = to_regclass(%s) AND a.attname = 'embedding'""",
            (self._quoted_name(),),
        ).fetchone()
        if row is None:
            return None
        type_name, comment = row
        dims = int(type_name[len("vector(") : -1]) if type_name.startswith("vector(") else 0
        return dims, comment

    def _quoted_name(self) -> str:
        return '"' + self.table_name + '"'

    def ensure_table(
        self, *, embedder: str, model: str, dimensions: int, columns: SinkColumns = SinkColumns()
    ) -> SinkTable:
        """Create the table if absent (under an advisory lock, so concurrent loaders agree),
        with ``columns`` as ``text`` columns; check an existing one.

        :raises FatalError: another length, model or kept columns (``check_compatible``); a
            kept column name longer than PostgreSQL's 63 bytes.
        """
        from psycopg import sql

        long = [n for n in columns.names if len(n.encode()) > _MAX_IDENTIFIER_BYTES]
        if long:
            raise FatalError(
                f"column {long[0]!r} is longer than PostgreSQL's "
                f"{_MAX_IDENTIFIER_BYTES}-byte names: rename it in the CSV to keep "
                "it in a pgvector sink"
            )
        extra = sql.SQL("").join(
            sql.SQL(", {} text").format(sql.Identifier(n)) for n in _extra_names(columns)
        )
        with self._transaction("create") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.identity,))
            exists = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (self._quoted_name(),)
            ).fetchone()[0]
            if not exists:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (id text PRIMARY KEY, embedding vector({}) NOT NULL, "
                        "text_sha256 text NOT NULL, run_key text NOT NULL{})"
                    ).format(self._ident(), sql.Literal(dimensions), extra)
                )
                meta = sink_metadata(
                    embedder=embedder, model=model, dimensions=dimensions, columns=columns
                )
                conn.execute(
                    sql.SQL("COMMENT ON TABLE {} IS {}").format(self._ident(), sql.Literal(meta))
                )
        found = self.describe()
        assert found is not None
        with self._transaction("check") as conn:  # the shape its own metadata names
            self._check_shape(conn, dimensions, found.columns)
        check_compatible(
            found,
            where=f"PostgreSQL table {self.identity}",
            model=model,
            dimensions=dimensions,
            columns=columns,
        )
        self._kept = found.columns
        return found

    def _check_shape(
        self, conn: Any, dimensions: int, columns: SinkColumns = SinkColumns()
    ) -> None:
        """Refuse a table of another shape before any row is sent (``shape_problems``).

        :raises FatalError: naming each difference (exit 3: a rerun meets the same table).
        """
        name = self._quoted_name()
        kind = conn.execute(relkind_sql(), (name,)).fetchone()[0]
        found = conn.execute(describe_columns_sql(), (name,)).fetchall()
        unique = bool(conn.execute(unique_id_sql(), (name,)).fetchone()[0])
        problems = shape_problems(
            found,
            has_unique_id=unique,
            kind=kind,
            dimensions=dimensions,
            extra=_extra_names(columns),
        )
        if problems:
            raise FatalError(
                f"PostgreSQL table {self.identity} is not of embedline's shape (id text PRIMARY "
                f"KEY, embedding vector({dimensions}), text_sha256 text, run_key text): "
                + "; ".join(problems)
                + ". Load into another table (?table=NAME) or fix that one"
            )

    def upsert(self, rows: pa.Table, *, run_key: str) -> UpsertResult:
        """Insert or replace ``rows`` by id in one transaction; rows PostgreSQL refuses for
        good are left out and listed (``UpsertResult.refused``).

        Checked before sending: a NUL in an id (PostgreSQL text cannot hold one) and a
        non-finite vector value (pgvector refuses NaN and infinity). The other rows are
        COPYed once into the stage table, then written by one ``INSERT … ON CONFLICT``
        (``adapters.sinks.pg_upsert.upsert_staged``). A batch the server refuses for a row
        (``classify`` = row: an index row too big, a value too long…) is bisected in
        savepoints of the same transaction, each attempt selecting its half of the staged
        rows, until each refused row stands alone, as the embedding adapter bisects a 400:
        one bad row in n costs about 2·log2(n) attempts, not n transactions, and the rows
        cross the network once. Any row already under a refused id is deleted in the same
        transaction (the table keeps no stale vector for it).

        :raises FatalError: the table is not of embedline's shape, or another refusal.
        :raises RetryableError: the connection failed.
        """
        if rows.num_rows == 0:
            return UpsertResult(0)
        ids = rows.column("id").to_pylist()
        shas = rows.column("text_sha256").to_pylist()
        dims = rows.schema.field("embedding").type.list_size
        matrix = vector_matrix(rows)
        extra = extra_values(rows, self._columns())
        refused = refused_before_sending(ids, matrix, extra)
        batch = Batch(ids, matrix, shas, extra)
        with self._transaction("upsert into") as conn:
            attempts = upsert_staged(conn, self._ident(), batch, dims, run_key, refused)
        return UpsertResult(len(ids) - len(refused), tuple(sorted(refused)), max(attempts, 1))

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete rows whose id is in ``ids`` (one transaction); return how many existed."""
        from psycopg import sql

        with self._transaction("delete from") as conn:
            cursor = conn.execute(
                sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(self._ident()), (list(ids),)
            )
            return int(cursor.rowcount)

    def held_keys(self) -> pa.Table:
        """Every row's ``id`` and ``text_sha256`` (and ``kept_sha256`` with kept columns;
        strings), read in one transaction (one snapshot): what the table holds, the record
        loads decide by (docs/reference/sinks.md). Those columns only (about 100 bytes a row), never
        the vectors or the kept values."""
        from psycopg import sql

        key = held_key_columns(self._columns())
        with self._transaction("read") as conn:
            rows = conn.execute(
                sql.SQL("SELECT {} FROM {}").format(
                    sql.SQL(", ").join(map(sql.Identifier, key)), self._ident()
                )
            ).fetchall()
        return pa.table(
            {name: pa.array([r[i] for r in rows], type=pa.string()) for i, name in enumerate(key)}
        )

    def delete_other_runs(self, run_key: str) -> int:
        """Delete every row not written by ``run_key`` (one transaction); return how many."""
        from psycopg import sql

        with self._transaction("delete from") as conn:
            cursor = conn.execute(
                sql.SQL("DELETE FROM {} WHERE run_key <> %s").format(self._ident()), (run_key,)
            )
            return int(cursor.rowcount)

    def finalize(self, *, keep_versions_s: float | None = None) -> str:
        """Create the HNSW cosine index if absent (``vector`` up to 2,000 dimensions,
        ``halfvec`` up to 4,000: ``pg_index.index_method``) and refresh the table's
        statistics; return what was done, for the load summary. An INVALID index of that
        name (a cancelled ``CREATE INDEX CONCURRENTLY``) is dropped and built again.
        ``keep_versions_s`` is LanceDB's: PostgreSQL keeps no table versions. Through an
        alias (a view embedline made), the table it points at gets the index.

        One transaction, its first statement ``SET LOCAL statement_timeout = 0``: a role
        with a statement timeout (managed services set one) does not cancel the build. The
        build gets what the server offers for it (``pg_index.index_build_settings``: memory
        for the graph, parallel workers within its cores), set for the transaction only;
        while it runs, a line every ``progress_interval_s`` seconds says how far it got
        (``pg_stat_progress_create_index``, read on a second connection).

        :raises RetryableError: the server cancelled the build anyway (57014: a timeout it
            enforces otherwise, e.g. a pooler's ``query_timeout``), named as the cause.
        """
        from psycopg import sql

        with self._transaction("index") as conn:
            conn.execute("SELECT set_config('statement_timeout', '0', true)")
            shape = self._shape(conn)
            method = index_method(shape[0]) if shape is not None and shape[0] else None
            if shape is None or method is None:
                logger.warning(
                    "%s: no HNSW index for %s-dimension vectors (pgvector indexes at most "
                    "%d, as halfvec); searches scan the table",
                    self.identity,
                    shape and shape[0],
                    HALFVEC_MAX_DIMENSIONS,
                )
                return "no index (vectors too long for HNSW)"
            table = sql.Identifier(self._indexed_table(conn))
            # fresh statistics: a filtered search picks its plan from them (pg_search)
            conn.execute(sql.SQL("ANALYZE {}").format(table))
            name = self._index_name(conn)
            state = index_state(conn, '"' + name + '"')
            if state == "valid":
                return "HNSW index present"
            if state == "invalid":
                logger.warning(
                    "%s: index %s is INVALID (a cancelled CREATE INDEX CONCURRENTLY?): "
                    "dropped, built again",
                    self.identity,
                    name,
                )
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
            self._build(conn, table, name, shape[0], method)
        return "HNSW index built" + (" (halfvec)" if shape[0] > VECTOR_MAX_DIMENSIONS else "")

    def _build(self, conn: Any, table: Any, name: str, dims: int, method: Any) -> None:
        """``CREATE INDEX name ON table method`` in ``conn``'s transaction, with the settings
        ``index_build_settings`` gives and progress lines."""
        from psycopg import sql

        rows = int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()[0])
        settings = index_build_settings(
            conn,
            rows=rows,
            dimensions=dims,
            bytes_per_dimension=4 if dims <= VECTOR_MAX_DIMENSIONS else 2,
            advice=", or load with --index later and build it with `embedline index` once set",
        )
        for setting, value in settings.items():
            conn.execute("SELECT set_config(%s, %s, true)", (setting, value))
        progress_logger.info(
            "%s: building the HNSW index over %d rows (%s)",
            self.identity,
            rows,
            ", ".join(f"{k} {v}" for k, v in settings.items()) or "the server's settings",
        )
        pid = conn.info.backend_pid
        with progress_lines(
            self.dsn, pid, self.identity, rows, self.progress_interval_s, self.on_progress
        ):
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} {}").format(
                    sql.Identifier(name), table, method
                )
            )

    def _index_name(self, conn: Any) -> str:
        """The HNSW index's name: ``TABLE_embedding_hnsw`` of the table searches use (for an
        alias, the table it points at now)."""
        return f"{self._indexed_table(conn)}_embedding_hnsw"

    def needs_index(self) -> bool:
        """Whether ``finalize`` has an index to build: vectors pgvector can index, and no
        valid HNSW index (none, or an INVALID one). One read-only transaction."""
        with self._transaction("read") as conn:
            shape = self._shape(conn)
            if shape is None or index_method(shape[0] or HALFVEC_MAX_DIMENSIONS + 1) is None:
                return False
            return index_state(conn, '"' + self._index_name(conn) + '"') != "valid"

    def search(
        self,
        vector: np.ndarray,
        k: int,
        *,
        columns: Sequence[str] = (),
        where: Sequence[tuple[str, str]] = (),
        exact: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Cosine search (``<=>``, through the HNSW index when present): up to ``k``
        ``(id, similarity, *values of columns)``, most similar first, among the rows whose
        ``where`` columns equal their values (``pg_search.filtered_search``: an exact scan
        or an iterative index scan, in one transaction; values are parameters). ``exact``:
        always the exact scan (a ``MATERIALIZED`` CTE the index cannot serve).

        Through an alias (a view), the index looked for is the one of the table the view
        points at (the ``embedline_aliases`` registry, read in the same transaction)."""
        from psycopg import sql

        query = np.asarray(vector, dtype=np.float32)
        with self._transaction("search") as conn:
            # an alias (a view) switched to another model since the query was embedded: the
            # lock taken here holds further switches back until this search ends
            conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 0").format(self._ident()))
            shape = self._shape(conn)
            if shape is not None and shape[0] not in (0, len(query)):
                raise RetryableError(
                    f"search {self.identity}: it now holds vectors of "
                    f"{shape[0]} floats, the query has {len(query)}: an "
                    "alias switched models meanwhile; search again"
                )
            index = '"' + self._index_name(conn) + '"'
            dims = len(query)
            # a halfvec index serves only searches cast as it is (pg_index.index_method)
            half = (
                dims
                if VECTOR_MAX_DIMENSIONS < dims <= HALFVEC_MAX_DIMENSIONS
                and index_state(conn, index) == "valid"
                else None
            )
            rows = filtered_search(
                conn, self._ident(), index, query, k, columns, where, exact=exact, half_dims=half
            )
        return [(str(i), 1.0 - float(d), *rest) for i, d, *rest in rows]

    def _indexed_table(self, conn: Any) -> str:
        """The table whose HNSW index serves searches of this name: the table itself, or
        for an alias (a view embedline made) the table it points at now."""
        if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (REGISTRY,)).fetchone()[0]:
            return self.table_name
        row = conn.execute(
            f"SELECT current FROM {REGISTRY} WHERE alias = %s", (self.table_name,)
        ).fetchone()
        return self.table_name if row is None else str(row[0])

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors (float32) of ``ids`` that the table holds, by id (one query)."""
        from psycopg import sql

        with self._transaction("read") as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, embedding FROM {} WHERE id = ANY(%s)").format(self._ident()),
                (list(ids),),
            ).fetchall()
        # pgvector's Vector (HalfVector) objects, or arrays
        return {
            str(i): np.asarray(getattr(e, "to_numpy", lambda e=e: e)(), dtype=np.float32)
            for i, e in rows
        }

    def close(self) -> None:
        """Close every connection this sink opened."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
        self._kept = None
