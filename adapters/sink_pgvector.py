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

from adapters.sinks import check_compatible, sink_metadata, sink_table_from_metadata
from embedline.errors import FatalError, RetryableError
from embedline.protocols import SinkTable

__all__ = ["HNSW_MAX_DIMENSIONS", "PgVectorSink"]

logger = logging.getLogger("embedline")

HNSW_MAX_DIMENSIONS = 2000  # pgvector: "vector - up to 2,000 dimensions" for HNSW indexes
_INDEX_BUILD_MEMORY = "512MB"  # a cap for the one index build, not an allocation


def _translate(exc: Exception, where: str) -> Exception:
    """Map a psycopg error to embedline's classes (adapter edge, most specific first)."""
    import psycopg

    if isinstance(exc, psycopg.errors.InsufficientPrivilege | psycopg.errors.InvalidPassword):
        return FatalError(f"{where}: {exc.__class__.__name__}: check the user's rights and "
                          "PGPASSWORD")  # fmt: skip
    if isinstance(exc, psycopg.errors.UndefinedFile | psycopg.errors.FeatureNotSupported):
        return FatalError(f"{where}: the pgvector extension is not available on this server "
                          f"({exc.__class__.__name__}); install pgvector")  # fmt: skip
    if isinstance(exc, psycopg.OperationalError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return RetryableError(f"{where}: {first}; check that the server is running")
    return exc


class PgVectorSink:
    """Table ``table`` in the PostgreSQL database at ``dsn`` (a password-free libpq URI).

    One connection per thread (psycopg connections run one transaction at a time), so
    ``parallel_loads`` chunk loads may run at once.
    """

    parallel_loads = 2

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
                conn = psycopg.connect(self.dsn, connect_timeout=10)
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
        found = self.describe()
        assert found is not None
        check_compatible(found, where=f"PostgreSQL table {self.identity}", model=model,
                         dimensions=dimensions)  # fmt: skip
        return found

    def upsert(self, rows: pa.Table, *, run_key: str) -> int:
        """Insert or replace ``rows`` by id in one transaction; return the rows written."""
        from psycopg import sql

        if rows.num_rows == 0:
            return 0
        ids = rows.column("id").to_pylist()
        shas = rows.column("text_sha256").to_pylist()
        dims = rows.schema.field("embedding").type.list_size
        flat = rows.column("embedding").combine_chunks().flatten()
        matrix = flat.to_numpy(zero_copy_only=False).reshape(-1, dims)
        with self._transaction("upsert into") as conn:
            conn.execute(sql.SQL(
                "CREATE TEMP TABLE embedline_stage (id text, embedding vector({}), "
                "text_sha256 text) ON COMMIT DROP").format(sql.Literal(dims)))
            with conn.cursor().copy("COPY embedline_stage FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["text", "vector", "text"])
                for row_id, vector, sha in zip(ids, matrix, shas, strict=True):
                    copy.write_row((row_id, vector, sha))
            conn.execute(sql.SQL(
                "INSERT INTO {} (id, embedding, text_sha256, run_key) "
                "SELECT id, embedding, text_sha256, %s FROM embedline_stage "
                "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, "
                "text_sha256 = EXCLUDED.text_sha256, run_key = EXCLUDED.run_key"
            ).format(self._ident()), (run_key,))
        return len(ids)

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

    def finalize(self) -> None:
        """Create the HNSW cosine index if absent (vectors of ≤ 2,000 dimensions)."""
        from psycopg import sql

        found = self.describe()
        if found is None or found.dimensions > HNSW_MAX_DIMENSIONS:
            logger.warning("%s: no HNSW index for %s-dimension vectors (pgvector indexes at "
                           "most %d); searches scan the table", self.identity,
                           found and found.dimensions, HNSW_MAX_DIMENSIONS)  # fmt: skip
            return
        with self._transaction("index") as conn:
            # pgvector's README: the build is much faster while the graph fits in
            # maintenance_work_mem (64 MB by default; 64k 384-d vectors need ~100 MB).
            # Measured here on 64,000 vectors: 62 s with 64 MB, 21 s with 512 MB.
            conn.execute(f"SET LOCAL maintenance_work_mem = '{_INDEX_BUILD_MEMORY}'")
            conn.execute(sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops)"
            ).format(sql.Identifier(f"{self.table_name}_embedding_hnsw"), self._ident()))

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
