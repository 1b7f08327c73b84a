"""A pgvector server that goes away in the middle of ``embedline load``: the load ends with
its summary and one line per failure kind, exit 1, and no Python traceback (an expected
failure: docs/guide/failures.md); a rerun once the server is back loads the rest."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.pg_server import start_postgres, stop_postgres

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

ROWS = 3000
CHUNK = 10


@pytest.fixture
def own_postgres() -> Iterator[tuple[object, Path]]:
    """A PostgreSQL server of this test's own (it is stopped mid-test)."""
    data = Path(tempfile.mkdtemp(prefix="embedline-test-pg-lost-"))
    os.chmod(data, 0o755)
    server = start_postgres(data / "pgdata")
    try:
        yield server, data / "pgdata"
    finally:
        stop_postgres(server)
        shutil.rmtree(data, ignore_errors=True)


def _rows(uri: str) -> int:
    try:
        with psycopg.connect(uri, connect_timeout=2) as db:
            return int(db.execute("SELECT count(*) FROM lost").fetchone()[0])  # type: ignore[index]
    except psycopg.Error:
        return 0


def _rows_loaded(summary: str) -> int:
    """Chunks the summary says it loaded now."""
    return int(re.search(r"chunks +(\d+) loaded now", summary)[1])  # type: ignore[index]


def test_a_server_lost_mid_load_ends_in_lines_not_tracebacks(
    own_postgres: tuple[object, Path], tmp_path: Path
) -> None:
    server, data = own_postgres
    uri = server.get_uri()  # type: ignore[attr-defined]
    (tmp_path / "in.csv").write_text(
        "id,text\n" + "".join(f"r{i},text number {i}\n" for i in range(ROWS))
    )
    common = ["--output", str(tmp_path / "out"), "--ledger", str(tmp_path / "ledger.sqlite3")]
    with FakeEmbeddingServer(dims=8) as fake:
        embedded = run_cli(
            "run", "in.csv", "--embedder", "openai", "--base-url", fake.base_url,
            "--model", "m", "--chunk-size", str(CHUNK), *common, cwd=tmp_path,
        )  # fmt: skip
    assert embedded.returncode == 0, embedded.stderr[-2000:]
    target = f"{uri}&table=lost"
    load = popen_cli(
        [sys.executable, "-m", "cli", "load", "--to", target, "--index", "later", *common],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while _rows(uri) == 0 and load.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert load.poll() is None, "the load ended before the server was stopped"
    stop_postgres(server)  # pg_ctl stop: the server ends its clients' connections
    out, err = load.communicate(timeout=300)
    assert load.returncode == 1, (out[-2000:], err[-3000:])
    assert "Traceback" not in out + err, err[-4000:]
    assert "rerun the same command to load only those" in err, err[-2000:]
    # the load stops sending once a whole wave failed (the other chunks are not sent, each
    # to be logged failing): a few lines, not three per chunk of the run
    assert err.count("ERROR") < 40, err[-3000:]
    line = next(x for x in err.splitlines() if "chunks not loaded" in x)
    not_loaded, total = map(int, re.findall(r"(\d+) of (\d+) chunks not loaded", line)[0])
    assert total == ROWS // CHUNK and 0 < not_loaded < total, line
    assert not_loaded == total - _rows_loaded(out), (line, out)

    back = start_postgres(data)  # the same data directory: the rows loaded are kept
    try:
        rerun = run_cli("load", "--to", target, "--index", "later", *common, cwd=tmp_path)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert _rows(back.get_uri()) == ROWS
    finally:
        stop_postgres(back)
