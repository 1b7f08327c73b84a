"""Ctrl-C in a terminal signals the whole process group, Prefect's temporary server included.
The run must still stop gracefully (exit 130, summary, consistent ledger) and leave no server
process behind."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.processes import wait_until_gone

pytestmark = pytest.mark.integration


def test_ctrl_c_to_the_process_group_stops_gracefully(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = "".join(f"r{i},text {i}\n" for i in range(60))
    (tmp_path / "in.csv").write_text("id,text\n" + rows)
    fake_openai.fail_when(lambda payload: {"delay_s": 0.3})
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(home))
    args = ["run", "in.csv", "--embedder", "openai", "--base-url", fake_openai.base_url,
            "--output", "out", "--ledger", "ledger.sqlite3", "--chunk-size", "4",
            "--concurrency", "2", "--chunk-retries", "0"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp_path,
                            env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((tmp_path / "out").glob("chunks/*.parquet")):
        assert time.monotonic() < deadline and proc.poll() is None, "no chunk was published"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted by SIGINT" in out
    db = sqlite3.connect(tmp_path / "ledger.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE state = 'running'").fetchone()[0] == 0
    assert wait_until_gone("PREFECT_HOME", str(home), timeout_s=5.0) == []
