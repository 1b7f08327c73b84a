"""``--task-runner dask`` with no ``PREFECT_API_URL`` (what a user tries first): the Dask
workers must talk to the run's temporary Prefect server, not start servers of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.prefect_home import fresh_prefect_home
from tests.support.processes import wait_until_gone

pytestmark = pytest.mark.integration


def _dask_run(
    tmp_path: Path, base_url: str, output: str, env_extra: dict[str, str], home: Path
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(fresh_prefect_home(home)), **env_extra)
    return subprocess.run(
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
            output,
            "--ledger",
            str(tmp_path / "ledger.sqlite3"),
            "--chunk-size",
            "500",
            "--task-runner",
            "dask",
            "--dask-workers",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _write_input(tmp_path: Path, rows: int) -> None:
    (tmp_path / "in.csv").write_text(
        "id,text\n" + "".join(f"d{i},dask text {i}\n" for i in range(rows))
    )


def _check_run(
    result: subprocess.CompletedProcess[str], home: Path, fake: FakeEmbeddingServer, rows: int
) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"rows       {rows:,} published of {rows:,}" in result.stdout
    assert "Server process did not start" not in result.stderr
    assert "address already in use" not in result.stderr
    assert wait_until_gone("PREFECT_HOME", str(home), timeout_s=5.0) == []
    assert fake.counters()["inputs"] >= rows  # every row was embedded (retries may add)


def test_dask_workers_use_the_temporary_server(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    _write_input(tmp_path, 5000)
    home = tmp_path / "prefect-home"
    result = _dask_run(
        tmp_path,
        fake_openai.base_url,
        f"s3://{s3_bucket}/dask-tmp",
        {"AWS_ENDPOINT_URL": moto_endpoint},
        home,
    )
    _check_run(result, home, fake_openai, 5000)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="dask-tmp/chunks/")
    assert listed["KeyCount"] == 10


@pytest.mark.slow
def test_ten_dask_runs_in_a_row_pass(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> None:
    _write_input(tmp_path, 5000)
    home = tmp_path / "prefect-home"
    for attempt in range(10):
        fake_openai.reset()
        result = _dask_run(tmp_path, fake_openai.base_url, f"out{attempt}", {}, home)
        _check_run(result, home, fake_openai, 5000)
