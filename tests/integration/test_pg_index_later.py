"""``--index later`` and ``embedline index TARGET`` through the CLI, on the embedded
PostgreSQL behind PgBouncer in transaction mode (Debian's pgbouncer): the run's load skips
the build and says so, ``embedline index`` builds it (one progress line), a load that finds
the run's rows but no index builds it (``loaded``, not ``already_loaded``), and searches
through the pooler find the run's rows."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.csv_data import ENGLISH, read_rows, write_rows
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli

pytestmark = [pytest.mark.integration]


def _indexes(pg_uri: str, table: str) -> list[bool]:
    with psycopg.connect(pg_uri) as conn:
        return [
            bool(v)
            for (v,) in conn.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                (f'"{table}_embedding_hnsw"',),
            ).fetchall()
        ]


def test_index_later_then_embedline_index_then_a_load_rebuilds_a_dropped_index(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    pg_uri: str,
    pgbouncer_uri: str,
    prefect_api_url: str,
) -> None:
    rows = read_rows(ENGLISH, 300)
    csv_path = write_rows(tmp_path / "in.csv", rows)
    sink = f"{pgbouncer_uri}?table=later"
    common = ["--output", str(tmp_path / "out"), "--ledger", str(tmp_path / "ledger.sqlite3")]
    ran = run_cli(
        "run",
        str(csv_path),
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--chunk-size",
        "100",
        "--allow-failed-rows",
        "--sink",
        sink,
        "--index",
        "later",
        *common,
        cwd=tmp_path,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert re.search(
        r"^index +deferred \(--index later\): embedline index '.*table=later'", ran.stdout, re.M
    ), ran.stdout
    assert _indexes(pg_uri, "later") == []

    built = run_cli("index", sink, "--progress-interval", "0.05", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert re.search(r"^index +HNSW index built in [\d.]+ s$", built.stdout, re.M), built.stdout
    assert "building the HNSW index over 300 rows" in built.stderr, built.stderr
    assert _indexes(pg_uri, "later") == [True]
    again = run_cli("index", sink, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert re.search(r"^index +HNSW index present in [\d.]+ s$", again.stdout, re.M), again.stdout

    # the index is part of what the sink holds: gone, a load of the same run builds it
    with psycopg.connect(pg_uri) as conn:
        conn.execute("DROP INDEX later_embedding_hnsw")
    loaded = run_cli("load", "--to", sink, *common, cwd=tmp_path, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert re.search(r"^load +loaded ", loaded.stdout, re.M), loaded.stdout
    assert re.search(r"^index +HNSW index built in [\d.]+ s$", loaded.stdout, re.M), loaded.stdout
    assert _indexes(pg_uri, "later") == [True]
    # in the UI: the build's own task run, and its progress artifact at 100 %
    with (
        temporary_settings(updates={PREFECT_API_URL: prefect_api_url}),
        get_client(sync_client=True) as client,
    ):
        progress = [
            a
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["embedline-progress"]))
            )
            if "table=later: HNSW index build" in (a.description or "")
        ]
        tasks = [t.name for t in client.read_task_runs() if t.name == "build-index"]
    assert [a.data for a in progress] == [100.0], progress
    assert tasks
    done = run_cli("load", "--to", sink, *common, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^load +already_loaded ", done.stdout, re.M), done.stdout

    searched = run_cli(
        "search", sink, rows[17][1], "--k", "3", "--base-url", fake_openai.base_url, cwd=tmp_path
    )
    assert searched.returncode == 0, searched.stderr
    first = searched.stdout.splitlines()[1].split()  # under the header "rank score id"
    assert first[0] == "1" and first[2] == rows[17][0], searched.stdout
