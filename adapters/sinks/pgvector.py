"""pgvector sink: a PostgreSQL table with a ``vector(d)`` column and an HNSW index (DESIGN §8).

Table (created if absent; the comment holds embedline's metadata as JSON)::

    CREATE TABLE t (id text PRIMARY KEY, embedding vector(d) NOT NULL,
                    text_sha256 text NOT NULL, run_key text NOT NULL)
    CREATE INDEX t_embedding_hnsw ON t USING hnsw (embedding vector_cosine_ops)

Each upsert is one transaction: binary ``COPY`` into a temporary table, then ``INSERT … ON
CONFLICT (id) DO UPDATE``. The HNSW index is built after the first load, not before: pgvector
builds it faster over existing rows than row by row (pgvector README, "HNSW"); HNSW indexes
``vector`` of at most 2,000 dimensions, so longer vectors are searched without one.
The password comes only from libpq's environment (``PGPASSWORD``, ``~/.pgpass``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.sinks.base import (
    SinkTable,
    UpsertResult,
    check_compatible,
    sink_metadata,
    sink_table_from_metadata,
    vector_matrix,
)
from adapters.sinks.pg_errors import (
    classify,
    describe_columns_sql,
    one_line,
    relkind_sql,
    row_reason,
    shape_problems,
    unique_id_sql,
)
from adapters.sinks.pg_errors import translate as _translate
from adapters.sinks.pg_index import index_build_settings, progress_lines
from embedline.errors import FatalError

__all__ = ["HNSW_MAX_DIMENSIONS", "PgVectorSink"]

logger = logging.getLogger("embedline")

HNSW_MAX_DIMENSIONS = 2000  # pgvector: "vector - up to 2,000 dimensions" for HNSW indexes


def sql_stage(dims: int) -> Any:
    """The per-transaction stage table a batch is COPYed into."""
    from psycopg import sql

    return sql.SQL("CREATE TEMP TABLE embedline_stage (id text, embedding vector({}), "
                   "text_sha256 text) ON COMMIT DROP").format(sql.Literal(dims))


def _refused_before_sending(ids: list[str], matrix: np.ndarray) -> list[tuple[int, str, str,
                                                                            str | None, str]]:
    """Rows no PostgreSQL table can take, found without a round trip: a NUL in the id
    (text cannot hold U+0000: PostgreSQL manual, "Character Types"), NaN or infinity in
    the vector (pgvector refuses them)."""
    finite = np.isfinite(matrix).all(axis=1)
    refused: list[tuple[int, str, str, str | None, str]] = []
    for i, row_id in enumerate(ids):
        if "\x00" in row_id:
            refused.append((i, row_id, "id_has_nul", None,
                            "the id holds a NUL byte, which PostgreSQL text cannot store"))
        elif not finite[i]:
            refused.append((i, row_id, "non_finite_vector", None,
                            "the vector holds NaN or infinity, which pgvector refuses"))
    return refused


class PgVectorSink:
    """Table ``table`` in the PostgreSQL database at ``dsn`` (a password-free libpq URI).

    One connection per thread (psycopg connections run one transaction at a time), so
    ``parallel_loads`` chunk loads may run at once.
    """

    parallel_loads = 2
    progress_interval_s = 10.0  # seconds between the index build's progress lines

    def __init__(self, dsn: str, *, table: str) -> None:
        self.dsn = dsn
        self.table_name = table
        self.identity = f"{dsn}{'&' if '?' in dsn else '?'}table={table}"
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PgVectorSink({self.identity!r})"

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            import psycopg

            try:
                # UTF-8 on the wire whatever the database's encoding: the server then names a
                # character it cannot hold (22P05, a dead letter), not psycopg's encoder
                conn = psycopg.connect(self.dsn, connect_timeout=10, client_encoding="UTF8")
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
            row = conn.execute(
                """SELECT format_type(a.atttypid, a.atttypmod), obj_description(c.oid, 'pg_class')
                   FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                   WHERE c.oid = to_regclass(%s) AND a.attname = 'embedding'""",
                (self._quoted_name(),),
            ).fetchone()
            if row is None:
                return None
            rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._ident()))
            count = int(rows.fetchone()[0])
        type_name, comment = row
        dims = int(type_name[len("vector("):-1]) if type_name.startswith("vector(") else 0
        return sink_table_from_metadata(comment, dimensions=dims, rows=count)

    def _quoted_name(self) -> str:
        return '"' + self.table_name + '"'

    def ensure_table(self, *, embedder: str, model: str, dimensions: int) -> SinkTable:
        """Create the table if absent (under an advisory lock, so concurrent loaders agree);
        check an existing one.

        :raises FatalError: another length or model (``check_compatible``).
        """
        from psycopg import sql

        with self._transaction("create") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.identity,))
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                  (self._quoted_name(),)).fetchone()[0]  # fmt: skip
            if not exists:
                conn.execute(sql.SQL(
                    "CREATE TABLE {} (id text PRIMARY KEY, embedding vector({}) NOT NULL, "
                    "text_sha256 text NOT NULL, run_key text NOT NULL)"
                ).format(self._ident(), sql.Literal(dimensions)))
                meta = sink_metadata(embedder=embedder, model=model, dimensions=dimensions)
                conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(
                    self._ident(), sql.Literal(meta)))
            self._check_shape(conn, dimensions)
        found = self.describe()
        assert found is not None
        check_compatible(found, where=f"PostgreSQL table {self.identity}", model=model,
                         dimensions=dimensions)  # fmt: skip
        return found

    def _check_shape(self, conn: Any, dimensions: int) -> None:
        """Refuse a table of another shape before any row is sent (``shape_problems``).

        :raises FatalError: naming each difference (exit 3: a rerun meets the same table).
        """
        name = self._quoted_name()
        kind = conn.execute(relkind_sql(), (name,)).fetchone()[0]
        columns = conn.execute(describe_columns_sql(), (name,)).fetchall()
        unique = bool(conn.execute(unique_id_sql(), (name,)).fetchone()[0])
        problems = shape_problems(columns, has_unique_id=unique, kind=kind, dimensions=dimensions)
        if problems:
            raise FatalError(
                f"PostgreSQL table {self.identity} is not of embedline's shape (id text PRIMARY "
                f"KEY, embedding vector({dimensions}), text_sha256 text, run_key text): "
                + "; ".join(problems) + ". Load into another table (?table=NAME) or fix that one")

    def upsert(self, rows: pa.Table, *, run_key: str) -> UpsertResult:
        """Insert or replace ``rows`` by id in one transaction; rows PostgreSQL refuses for
        good are left out and listed (``UpsertResult.refused``).

        Checked before sending: a NUL in an id (PostgreSQL text cannot hold one) and a
        non-finite vector value (pgvector refuses NaN and infinity). A batch the server
        refuses for a row (``classify`` = row: an index row too big, a value too long…) is
        bisected in savepoints of the same transaction until each refused row stands alone,
        as the embedding adapter bisects a 400: one bad row in n costs about 2·log2(n)
        attempts, not n transactions. Any row already under a refused id is deleted in the
        same transaction (the table keeps no stale vector for it).

        :raises FatalError: the table is not of embedline's shape, or another refusal.
        :raises RetryableError: the connection failed.
        """
        import psycopg

        if rows.num_rows == 0:
            return UpsertResult(0)
        ids = rows.column("id").to_pylist()
        shas = rows.column("text_sha256").to_pylist()
        dims = rows.schema.field("embedding").type.list_size
        matrix = vector_matrix(rows)
        refused = _refused_before_sending(ids, matrix)
        stack = [[i for i in range(len(ids)) if i not in {r[0] for r in refused}]]
        attempts = 0
        with self._transaction("upsert into") as conn:
            conn.execute(sql_stage(dims))
            while stack:
                part = stack.pop()
                if not part:
                    continue
                attempts += 1
                try:
                    with conn.transaction():  # a savepoint: a refusal undoes only this part
                        self._write(conn, part, ids, matrix, shas, run_key)
                except psycopg.Error as exc:
                    if classify(exc) != "row":
                        raise
                    if len(part) == 1:
                        refused.append((part[0], ids[part[0]], row_reason(exc), exc.sqlstate,
                                        one_line(exc)))
                    else:
                        middle = len(part) // 2
                        stack += [part[middle:], part[:middle]]
            self._forget(conn, [r[1] for r in refused if r[2] != "id_has_nul"])
        return UpsertResult(len(ids) - len(refused), tuple(sorted(refused)), max(attempts, 1))

    def _write(self, conn: Any, part: list[int], ids: list[str], matrix: np.ndarray,
               shas: list[str], run_key: str) -> None:
        """COPY rows ``part`` into the stage table, upsert them, empty the stage."""
        from psycopg import sql

        with conn.cursor().copy("COPY embedline_stage FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["text", "vector", "text"])
            for i in part:
                copy.write_row((ids[i], matrix[i], shas[i]))
        conn.execute(sql.SQL(
            "INSERT INTO {} (id, embedding, text_sha256, run_key) "
            "SELECT id, embedding, text_sha256, %s FROM embedline_stage "
            "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, "
            "text_sha256 = EXCLUDED.text_sha256, run_key = EXCLUDED.run_key"
        ).format(self._ident()), (run_key,))
        conn.execute("TRUNCATE embedline_stage")

    def _forget(self, conn: Any, ids: list[str]) -> None:
        """Delete rows under refused ids (an id the server cannot even compare cannot be in
        the table: skipped)."""
        import psycopg
        from psycopg import sql

        for row_id in ids:
            try:
                with conn.transaction():
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self._ident()),
                                 (row_id,))
            except psycopg.Error as exc:
                if classify(exc) != "row":
                    raise

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete rows whose id is in ``ids`` (one transaction); return how many existed."""
        from psycopg import sql

        with self._transaction("delete from") as conn:
            cursor = conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(
                self._ident()), (list(ids),))
            return int(cursor.rowcount)

    def held_keys(self) -> pa.Table:
        """Every row's ``id`` and ``text_sha256`` (strings), read in one transaction (one
        snapshot): what the table holds, the record loads decide by (DESIGN §9). Two text
        columns only (about 100 bytes a row), never the vectors."""
        from psycopg import sql

        with self._transaction("read") as conn:
            rows = conn.execute(sql.SQL("SELECT id, text_sha256 FROM {}").format(
                self._ident())).fetchall()
        return pa.table({"id": pa.array([r[0] for r in rows], type=pa.string()),
                         "text_sha256": pa.array([r[1] for r in rows], type=pa.string())})

    def delete_other_runs(self, run_key: str) -> int:
        """Delete every row not written by ``run_key`` (one transaction); return how many."""
        from psycopg import sql

        with self._transaction("delete from") as conn:
            cursor = conn.execute(sql.SQL("DELETE FROM {} WHERE run_key <> %s").format(
                self._ident()), (run_key,))
            return int(cursor.rowcount)

    def finalize(self, *, keep_versions_s: float | None = None) -> str:
        """Create the HNSW cosine index if absent (vectors of ≤ 2,000 dimensions); return
        what was done, for the load summary. ``keep_versions_s`` is LanceDB's: PostgreSQL
        keeps no table versions.

        The build gets what PostgreSQL offers for it (``index_build_settings``): enough
        ``maintenance_work_mem`` for the graph and parallel maintenance workers, set for its
        transaction only; while it runs, a line every ``progress_interval_s`` seconds says how
        far it got (``pg_stat_progress_create_index``, read on a second connection).
        """
        from psycopg import sql

        found = self.describe()
        if found is None or found.dimensions > HNSW_MAX_DIMENSIONS:
            logger.warning("%s: no HNSW index for %s-dimension vectors (pgvector indexes at "
                           "most %d); searches scan the table", self.identity,
                           found and found.dimensions, HNSW_MAX_DIMENSIONS)  # fmt: skip
            return "no index (vectors too long for HNSW)"
        name = f"{self.table_name}_embedding_hnsw"
        with self._transaction("index") as conn:
            present = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                   ('"' + name + '"',)).fetchone()[0]  # fmt: skip
            if present:
                return "HNSW index present"
            settings = index_build_settings(conn, rows=found.rows, dimensions=found.dimensions)
            for setting, value in settings.items():
                conn.execute(sql.SQL("SELECT set_config({}, {}, true)").format(
                    sql.Literal(setting), sql.Literal(value)))
            logger.info("%s: building the HNSW index over %d rows (%s)", self.identity,
                        found.rows, ", ".join(f"{k} {v}" for k, v in settings.items()))
            pid = conn.info.backend_pid
            with progress_lines(self.dsn, pid, self.identity, found.rows,
                                 self.progress_interval_s):  # fmt: skip
                conn.execute(sql.SQL(
                    "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops)"
                ).format(sql.Identifier(name), self._ident()))
        return "HNSW index built"

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Cosine search (``<=>``, through the HNSW index when present): up to ``k``
        ``(id, similarity)``, most similar first."""
        from psycopg import sql

        query = np.asarray(vector, dtype=np.float32)
        with self._transaction("search") as conn:
            rows = conn.execute(sql.SQL(
                "SELECT id, embedding <=> %s AS distance FROM {} ORDER BY distance LIMIT %s"
            ).format(self._ident()), (query, k)).fetchall()
        return [(str(i), 1.0 - float(d)) for i, d in rows]

    def close(self) -> None:
        """Close every connection this sink opened."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
