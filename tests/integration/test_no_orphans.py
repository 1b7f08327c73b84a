"""No process outlives the command: after a ``kill -9`` of the CLI, or of its whole process
group (what a supervisor, an OOM kill or a CI timeout does), the temporary Prefect server it
started — and, with Dask, the workers — exit within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.prefect_home import fresh_prefect_home
from tests.support.processes import processes_with_env, wait_until_gone

pytestmark = pytest.mark.integration

_GONE_WITHIN_S = 6.0


def _start_cli(tmp_path: Path, base_url: str, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},text {i}\n" for i in range(40)))
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(fresh_prefect_home(home)))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "run",
            "in.csv",
            "--embedder",
            "openai",
            "--base-url",
            base_url,
            "--output",
            "out",
            "--ledger",
            "ledger.sqlite3",
            "--chunk-size",
            "4",
            "--concurrency",
            "2",
            *extra,
        ],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, home


def _wait_for_a_published_chunk(proc: subprocess.Popen[str], out: Path) -> None:
    deadline = time.monotonic() + 180
    while not list(out.glob("chunks/*.parquet")):
        assert time.monotonic() < deadline and proc.poll() is None, "no chunk was published"
        time.sleep(0.1)


@pytest.mark.parametrize("target", ["cli", "process-group"])
def test_kill_9_leaves_no_prefect_server(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, target: str
) -> None:
    fake_openai.fail_when(lambda payload: {"delay_s": 0.3})
    proc, home = _start_cli(tmp_path, fake_openai.base_url)
    _wait_for_a_published_chunk(proc, tmp_path / "out")
    helpers = [p for p in processes_with_env("PREFECT_HOME", str(home)) if p != proc.pid]
    assert helpers, "the run should have a Prefect server process by now"
    if target == "cli":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    survivors = wait_until_gone("PREFECT_HOME", str(home), timeout_s=_GONE_WITHIN_S)
    for pid in survivors:  # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


def test_kill_9_of_a_dask_run_leaves_no_server_and_no_worker(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    fake_openai.fail_when(lambda payload: {"delay_s": 0.3})
    proc, home = _start_cli(
        tmp_path, fake_openai.base_url, "--task-runner", "dask", "--dask-workers", "2"
    )
    _wait_for_a_published_chunk(proc, tmp_path / "out")
    helpers = [p for p in processes_with_env("PREFECT_HOME", str(home)) if p != proc.pid]
    assert len(helpers) >= 3, "expected the Prefect server and two Dask worker processes"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    survivors = wait_until_gone("PREFECT_HOME", str(home), timeout_s=_GONE_WITHIN_S)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
