"""Ctrl-C of ``embedline run --dask-address`` stops the cluster's chunks too. The workers of a
cluster started apart are other processes (other machines): the terminal's SIGINT reaches
only the command. Before, Dask had already handed the workers every group of chunks, and they
went on starting chunks and paying for them after the command exited 130 (the whole input
paid for). The run's stop now reaches them through its marker in the store
(``tasks/lease/run_stop.py``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.dask_cluster import external_cluster, start_run, wait_for_answers
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]


def test_ctrl_c_of_the_command_stops_the_external_clusters_chunks(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str, fake_openai: FakeEmbeddingServer
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AWS_ENDPOINT_URL": moto_endpoint,
        "EMBEDLINE_API_KEY": "sk-test",
    }
    rows = [(f"c{i:03d}", f"stop text {i}") for i in range(600)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    args = ["run", "in.csv", "--output", f"s3://{s3_bucket}/stop", "--ledger", "ledger.sqlite3"]
    args += ["--embedder", "openai", "--base-url", fake_openai.base_url, "--grace", "5"]
    args += ["--chunk-size", "10", "--batch-size", "10", "--concurrency", "2"]
    fake_openai.reset()
    fake_openai.fail_when(lambda payload: {"delay_s": 0.4})  # 60 requests: 12 s at 2 a time
    # 8 threads: the run keeps 8 groups of chunks on the worker, 2 requests at a time
    with external_cluster(tmp_path / "cluster", env, [("--nthreads", "8")]) as cluster:
        run = start_run(
            tmp_path, env, [*args, "--task-runner", "dask", "--dask-address", cluster.address]
        )
        wait_for_answers(fake_openai, run, 4, "SIGINT")
        run.send_signal(signal.SIGINT)  # the command only: the cluster is not its group
        out, err = run.communicate(timeout=120)
        at_exit = fake_openai.answered
        time.sleep(8)  # what the workers would still send, the cluster alive
        after = fake_openai.answered
    assert run.returncode == 130, (out + err)[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # chunks in flight at the signal may finish (at most one per worker thread, and what
    # the poll of the marker lets start within a second); no other chunk starts
    assert after - at_exit <= 2, (at_exit, after)
    assert after <= 4 + 2 + 2 * 3, f"{after} of {len(rows) // 10} chunks sent after a Ctrl-C"
