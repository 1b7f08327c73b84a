"""Chunk tasks on a local multi-process Dask cluster, publishing to moto's S3 server; only
the flow process writes the ledger."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.output import vectors_by_id
from tests.support.processes import wait_until_gone

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]


def test_dask_workers_embed_and_publish_to_s3(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    rows = [(f"d{i:02d}", f"dask text {i}") for i in range(12)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    result = run_cli(
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        f"s3://{s3_bucket}/dask",
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "3",
        "--task-runner",
        "dask",
        "--dask-workers",
        "2",
        cwd=tmp_path,
        env={"AWS_ENDPOINT_URL": moto_endpoint},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="dask/")["Contents"]]
    manifest_key = next(k for k in keys if "/manifests/" in k)
    manifest = json.loads(s3.get_object(Bucket=s3_bucket, Key=manifest_key)["Body"].read())
    bodies = {
        e["object"]: s3.get_object(Bucket=s3_bucket, Key=f"dask/{e['object']}")["Body"].read()
        for e in manifest["chunks"]
    }
    vectors = vectors_by_id(bodies, manifest)
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)
    assert "embed-chunk-0003" in result.stderr  # task runs reported from the workers


def test_remote_dask_workers_refuse_a_local_output(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("id,text\n1,a\n")
    result = run_cli(
        "run",
        "in.csv",
        "--task-runner",
        "dask",
        "--dask-address",
        "tcp://127.0.0.1:8786",
        "--output",
        "./out",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "s3:// --output" in result.stderr


def test_local_cluster_workers_run_without_the_statistical_profiler(tmp_path: Path) -> None:
    """Dask's profiler (``sys._current_frames`` every 10 ms) deadlocked a worker on CPython
    3.11 in a 20,000-row run (gh-106883, dask/distributed#8616); the slow soak
    ``test_dask_temporary_server.py::test_ten_dask_runs_in_a_row_pass`` covers the fault."""
    import dask.config

    from embedline.settings import RunSettings
    from flows.task_runner import task_runner

    settings = RunSettings(input=str(tmp_path / "in.csv"), task_runner="dask", dask_workers=2)
    with task_runner(settings, 2) as runner:
        enabled = runner.client.run(dask.config.get, "distributed.worker.profile.enabled")
        levels = runner.client.run(_distributed_log_level)
        filtered = runner.client.run(_drops_scheduler_gone_tracebacks)
        ctrl_c = runner.client.run(_sigint_handler)
    assert list(enabled.values()) == [False, False]
    # Dask's INFO chatter ("Closing Nanny …", 34 lines a run) is off in the workers too
    assert list(levels.values()) == [logging.WARNING, logging.WARNING]
    assert list(filtered.values()) == [True, True]  # flows.dask_preload ran in each worker
    assert list(ctrl_c.values()) == ["SIG_IGN", "SIG_IGN"]  # the CLI stops its workers


def test_the_window_follows_the_clusters_threads(tmp_path: Path) -> None:
    """Before, the flow kept ``--concurrency`` + 1 chunk task runs in flight whatever the
    cluster's size, so a second worker added no throughput. Now: the cluster's worker
    threads, read from the scheduler (an in-process cluster: seconds, no sockets)."""
    from distributed import LocalCluster

    from embedline.settings import RunSettings
    from flows.task_runner import in_flight, task_runner

    with LocalCluster(
        n_workers=2, threads_per_worker=3, processes=False, dashboard_address="127.0.0.1:0"
    ) as cluster:
        settings = RunSettings(
            input=str(tmp_path / "in.csv"),
            output="s3://bucket/out",
            task_runner="dask",
            dask_address=cluster.scheduler_address,
            concurrency=8,
        )
        with task_runner(settings, settings.concurrency + 1) as runner:
            assert in_flight(runner, settings, settings.concurrency + 1) == 2 * 3
            cluster.scale(3)
            runner.client.wait_for_workers(3, timeout=30)
            assert in_flight(runner, settings, settings.concurrency + 1) == 3 * 3
    with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as empty:
        adaptive = settings.model_copy(update={"dask_address": empty.scheduler_address})
        with task_runner(adaptive, 9) as runner:  # no worker yet: as one process
            assert in_flight(runner, adaptive, 9) == 9
    threads = RunSettings(input=str(tmp_path / "in.csv"), concurrency=8)
    assert in_flight(None, threads, 9) == 9  # threads: --concurrency + 1, as given


def _distributed_log_level() -> int:
    return logging.getLogger("distributed").getEffectiveLevel()


def _sigint_handler() -> str:
    handler = signal.getsignal(signal.SIGINT)
    return getattr(handler, "name", str(handler))


def _drops_scheduler_gone_tracebacks() -> bool:
    handlers = logging.getLogger("distributed").handlers
    return bool(handlers) and all(
        any(type(f).__name__ == "SchedulerGoneFilter" for f in h.filters) for h in handlers
    )


@pytest.mark.parametrize(
    "after",
    ["Creating a new Dask cluster", "The Dask dashboard is"],
    ids=["cluster-starting", "workers-up"],
)
def test_ctrl_c_while_the_local_cluster_starts_is_one_line_and_leaves_no_process(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, after: str
) -> None:
    """Before: exit 130 and the one line, but then distributed's exit handler printed
    "Exception ignored in atexit callback" and an ``AssertionError: Status.running``
    traceback from the half-started cluster's teardown, and its INFO lines; with the
    workers up, a worker logged a ``CommClosedError`` traceback ("Failed to communicate
    with scheduler during heartbeat") as the scheduler closed. And Prefect's "Crash
    detected!" lines, and the resource tracker's leaked-semaphore warning."""
    (tmp_path / "in.csv").write_text("id,text\n1,alpha\n2,beta\n")
    args = [
        sys.executable,
        "-m",
        "cli",
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--ledger",
        "ledger.sqlite3",
        "--task-runner",
        "dask",
        "--dask-workers",
        "2",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "EMBEDLINE_TEST_MARK": str(tmp_path)}
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if after in line:
                break
        time.sleep(0.5 if after.startswith("Creating") else 0.1)  # the cluster: 1-3 s
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, "".join(lines) + err
    assert err.strip().splitlines()[-1] == (
        "embedline: interrupted by SIGINT; rerun the same command to resume"
    ), err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert "distributed" not in err, err[-3000:]
    # Prefect's own account of the crash, and multiprocessing's resource tracker warning
    # ("There appear to be 12 leaked semaphore objects") after the last line: 5 of 5 in a
    # break test, before
    assert "Crash detected" not in err and "resource_tracker" not in err, err[-3000:]
    assert wait_until_gone("EMBEDLINE_TEST_MARK", str(tmp_path), timeout_s=10.0) == []


def test_ctrl_c_to_the_process_group_gives_in_flight_chunks_their_grace(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """A terminal's Ctrl-C reaches the whole foreground process group, the local cluster's
    workers included. Before, each worker took the SIGINT itself: every chunk task ended
    with CancelledError at once (the requests it had paid for lost), KeyboardInterrupt
    tracebacks were printed, and the run waited out ``--grace`` with nothing to wait for."""
    rows = [(f"g{i:03d}", f"grace text {i}") for i in range(200)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    fake_openai.fail_when(lambda payload: {"delay_s": 0.5})
    args = ["run", "in.csv", "--embedder", "openai", "--base-url", fake_openai.base_url]
    args += ["--output", "out", "--ledger", "ledger.sqlite3", "--chunk-size", "50"]
    args += ["--batch-size", "5", "--concurrency", "4", "--grace", "60"]
    args += ["--task-runner", "dask", "--dask-workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "EMBEDLINE_TEST_MARK": str(tmp_path)}
    proc = popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 120
        chunk_of = {
            hashlib.sha256(t.encode()).hexdigest(): n // 50 for n, (_, t) in enumerate(rows)
        }
        # every chunk in flight (each has an answer), none finished (10 requests a chunk):
        # a chunk not started at the signal does not start (the run's stop marker)
        while len({chunk_of[h] for h in fake_openai.charged_texts()}) < 4:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert re.search(r"^chunks +4 published now", out, re.M), out  # all 4 were in flight
    assert sum(fake_openai.charged_texts().values()) == len(rows)  # nothing paid for twice
    assert wait_until_gone("EMBEDLINE_TEST_MARK", str(tmp_path), timeout_s=10.0) == []
