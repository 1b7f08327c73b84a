"""The pgvector sink through PgBouncer in transaction mode (Debian's pgbouncer 1.18, which
keeps no prepared statements across transactions) in front of the embedded PostgreSQL: each
transaction may run on another server connection, so nothing may outlive one — no
server-side prepared statement (psycopg prepares a query run 5 times unless told not to:
``42P05 prepared statement "_pg3_0" already exists``), no session ``SET``."""

from __future__ import annotations

import numpy as np
import psycopg
import pyarrow as pa
import pytest

from adapters.sinks.pgvector import PgVectorSink

pytestmark = [pytest.mark.integration]


def _rows(start: int, n: int, dims: int = 16) -> pa.Table:
    vectors = np.random.default_rng(start).standard_normal((n, dims)).astype(np.float32)
    return pa.table(
        {
            "id": pa.array([f"r{i}" for i in range(start, start + n)]),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dims),
            "text_sha256": pa.array(["h"] * n),
            "title": pa.array([f"t{i % 50}" for i in range(start, start + n)]),
        }
    )


def test_loads_index_builds_and_searches_through_pgbouncer_in_transaction_mode(
    pgbouncer_uri: str, pg_uri: str
) -> None:
    from embedline.protocols import SinkColumns

    sink = PgVectorSink(pgbouncer_uri, table="pooled_bouncer")
    sink.progress_interval_s = 0.05
    sink.ensure_table(embedder="openai", model="m", dimensions=16, columns=SinkColumns(("title",)))
    # the same statements again and again: psycopg would prepare them by the fifth
    for start in range(0, 6000, 500):
        assert sink.upsert(_rows(start, 500), run_key="r").rows == 500
    assert len(sink.held_keys()) == 6000
    assert sink.needs_index()
    assert sink.finalize() == "HNSW index built"
    assert not sink.needs_index()
    query = sink.vectors(["r1234"])["r1234"]
    for _ in range(8):
        assert sink.search(query, 3)[0][0] == "r1234"
        assert sink.search(query, 3, exact=True)[0][0] == "r1234"
        # a filtered search: its SET LOCALs stay inside its transaction
        hit = sink.search(query, 3, columns=["title"], where=[("title", "t34")])[0]
        assert hit[0] == "r1234" and hit[2] == "t34"
    assert sink.delete_ids(["r0", "r1"]) == 2
    assert sink.finalize() == "HNSW index present"
    sink.close()
    # and nothing of the sink's was left on the server's connections
    with psycopg.connect(pg_uri) as conn:
        assert conn.execute("SELECT count(*) FROM pooled_bouncer").fetchone()[0] == 5998
        settings = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'postgres' "
            "AND query ILIKE 'SET %'"
        ).fetchone()[0]
        assert settings == 0
