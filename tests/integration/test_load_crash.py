"""``kill -9`` during ``embedline load``, then ``embedline load`` again: the table ends complete,
with every vector right and no id twice; chunks recorded as loaded are not loaded again."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.csv_data import ENGLISH, expected_vectors, read_rows, write_rows
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.qdrant_local import qdrant_path, qdrant_vectors, unit_vectors

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

# 60 chunks: each load-chunk task is a Prefect task run, ~20-50 ms, so the kill after the
# 10th leaves 50 (over a second) to spare; 6,000 rows (240 chunks) proved no more
ROWS, CHUNK = 1500, 25


def _loaded_chunks(ledger: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=1)
        try:
            return int(db.execute("SELECT count(*) FROM sink_chunks").fetchone()[0])
        finally:
            db.close()
    except sqlite3.OperationalError:
        return 0  # no table yet


def _table(kind: str, sink: str, pg_uri: str) -> list[tuple[str, np.ndarray]]:
    if kind == "pgvector":
        import psycopg
        from pgvector.psycopg import register_vector

        with psycopg.connect(pg_uri) as conn:
            register_vector(conn)
            rows = conn.execute("SELECT id, embedding FROM crash").fetchall()
        return [(i, np.asarray(v.to_numpy(), dtype=np.float32)) for i, v in rows]
    if kind == "qdrant":
        return qdrant_vectors(qdrant_path(sink), "crash")
    import lancedb

    table = lancedb.connect(sink[len("lancedb://") :].split("?")[0]).open_table("crash").to_arrow()
    return [
        (i, np.asarray(v, dtype=np.float32))
        for i, v in zip(
            table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True
        )
    ]


@pytest.fixture(scope="module")
def published(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[tuple[str, str]], Path]]:
    """One committed run (output root and ledger) of the first ROWS rows, made once for the
    three sinks: each test loads its own copy (a load writes its lease into the output)."""
    cwd = tmp_path_factory.mktemp("published")
    rows = read_rows(ENGLISH, ROWS)
    with FakeEmbeddingServer() as server:
        made = run_cli(
            "run",
            str(write_rows(cwd / "in.csv", rows)),
            "--embedder",
            "openai",
            "--base-url",
            server.base_url,
            "--output",
            str(cwd / "out"),
            "--ledger",
            str(cwd / "ledger.sqlite3"),
            "--chunk-size",
            str(CHUNK),
            "--allow-failed-rows",
            cwd=cwd,
            timeout=600,
        )
    assert made.returncode == 0, made.stderr[-2000:]
    yield rows, cwd


# qdrant with make test-all only (CI budget: 18 s, the slowest of the three): the resume
# is the ledger's, the same for every sink (lancedb and pgvector in CI), and Qdrant's
# idempotent upsert is unit-tested (tests/unit/adapters/sinks/test_qdrant.py)
@pytest.mark.parametrize(
    "kind", ["lancedb", "pgvector", pytest.param("qdrant", marks=pytest.mark.slow)]
)
def test_kill_9_during_load_then_load_again_completes_without_duplicates(
    kind: str, tmp_path: Path, published: tuple[list[tuple[str, str]], Path], pg_uri: str
) -> None:
    rows, made = published
    ledger = tmp_path / "ledger.sqlite3"
    shutil.copytree(made / "out", tmp_path / "out")
    for part in made.glob("ledger.sqlite3*"):  # with any -wal/-shm beside it
        shutil.copyfile(part, tmp_path / part.name)
    sink = {
        "pgvector": f"{pg_uri}&table=crash",
        "qdrant": f"qdrant+local://{tmp_path}/qdrant?collection=crash",
        "lancedb": f"lancedb://{tmp_path}/lance?table=crash",
    }[kind]
    load = ["load", "--to", sink, "--output", str(tmp_path / "out"), "--ledger", str(ledger)]
    proc = popen_cli(
        [sys.executable, "-m", "cli", *load],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while _loaded_chunks(ledger) < 10 and proc.poll() is None:
            assert time.monotonic() < deadline, "the load never got going"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and anything it started
        proc.wait()
    loaded_before = _loaded_chunks(ledger)
    assert proc.returncode == -signal.SIGKILL
    assert 10 <= loaded_before < ROWS // CHUNK, "the load was not killed midway"

    again = run_cli(*load, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    skipped = int(re.search(r"^chunks +\d+ loaded now, (\d+) skipped", again.stdout, re.M).group(1))
    assert skipped >= loaded_before  # what the ledger recorded was not loaded again
    table = _table(kind, sink, pg_uri)
    ids = [i for i, _ in table]
    assert len(ids) == len(set(ids)), "an id appears twice"
    want = expected_vectors(rows)
    assert set(ids) == set(want)
    if kind == "qdrant":  # a Cosine collection stores unit vectors
        want = unit_vectors(want)
        assert all(np.allclose(v, want[i], rtol=0, atol=1e-6) for i, v in table)
        return
    assert all(np.array_equal(v, want[i]) for i, v in table)
