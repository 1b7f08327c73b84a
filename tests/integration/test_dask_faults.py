"""A Dask cluster that goes away mid-run ends like the single process does: one line that
says to rerun, exit 1, no traceback; the rerun on a new cluster finishes what is left and
every vector is the fake server's; the summary counts every input the fake charged (from the
store: what the chunks in flight sent too). (The scheduler and worker are processes of their
own, as a user's platform starts them; the scheduler is SIGKILLed while chunks are in
flight, the worker frozen just before.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.dask_cluster import (
    assert_counted_as_the_store_holds,
    assert_read_back_exact,
    cluster_env,
    external_cluster,
    inputs_charged,
    start_run,
    wait_for_answers,
)
from tests.support.fake_openai import FakeEmbeddingServer

#: The one worker: 2 threads, its nanny in a process group with it.
ONE_WORKER = ("--nthreads", "2")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("prefect_api_url"),
    pytest.mark.slow,  # two clusters and a 30 s reconnect timeout: make test-all runs it
]


def test_a_scheduler_killed_mid_run_is_one_line_exit_1_and_a_rerun_finishes(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    fake_openai: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = cluster_env(moto_endpoint)
    rows = [(f"r{i:03d}", f"scheduler text {i}") for i in range(200)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    output = f"s3://{s3_bucket}/lost"

    def run(address: str) -> subprocess.Popen[str]:
        args = ["run", "in.csv", "--output", output, "--ledger", "ledger.sqlite3"]
        args += ["--embedder", "openai", "--base-url", fake_openai.base_url]
        args += ["--chunk-size", "10", "--batch-size", "2"]
        return start_run(tmp_path, env, [*args, "--task-runner", "dask", "--dask-address", address])

    fake_openai.reset()
    fake_openai.fail_when(lambda payload: {"delay_s": 0.5})
    with external_cluster(tmp_path / "first", env, [ONE_WORKER]) as cluster:
        first = run(cluster.address)
        deadline = time.monotonic() + 120
        while fake_openai.answered < 10:
            assert first.poll() is None and time.monotonic() < deadline, first.stderr
            time.sleep(0.1)
        # the worker is frozen first, so that what it sent is what the summary can count:
        # a worker that goes on after the CLI ends sends what no summary sees
        os.killpg(cluster.workers[0].pid, signal.SIGSTOP)
        os.killpg(cluster.scheduler.pid, signal.SIGKILL)
        stdout, stderr = first.communicate(timeout=180)
    time.sleep(1)  # the fake charges a request in flight after its delay, client or not
    # what the chunk tasks sent, from the store: kept requests of unpublished chunks too
    assert inputs_charged(stdout + stderr) == sum(fake_openai.charged_texts().values())
    assert first.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("embedline: error: stopped: WorkerLostError"), stderr[-3000:]
    assert "rerun the same command to resume" in last

    fake_openai.fail_when(lambda payload: None)
    with external_cluster(tmp_path / "second", env, [ONE_WORKER]) as cluster:
        rerun = run(cluster.address)
        _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-3000:]
    assert_read_back_exact(output, rows, moto_endpoint, monkeypatch)
    # texts in requests in flight at the kill may be charged again, nothing else
    assert max(fake_openai.charged_texts().values()) <= 2


def test_chunks_a_lost_scheduler_leaves_running_are_waited_for_and_counted(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    s3_client: Any,
    fake_openai: FakeEmbeddingServer,
) -> None:
    """The scheduler SIGKILLed, its two workers left alone: a chunk whose one request is on
    the wire publishes after the flow's futures ended (its worker closes, and sends nothing
    more). The command waits for such chunks (their leases in the store), so its line counts
    every chunk object the store ends with and its summary every input the fake charged;
    the rerun pays for no text again."""
    env = cluster_env(moto_endpoint)
    rows = [(f"r{i:04d}", f"orphaned text {i}") for i in range(400)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    output = f"s3://{s3_bucket}/orphans"

    def run(address: str) -> subprocess.Popen[str]:
        args = ["run", "in.csv", "--output", output, "--ledger", "ledger.sqlite3"]
        args += ["--embedder", "openai", "--base-url", fake_openai.base_url]
        args += ["--chunk-size", "10", "--batch-size", "10"]  # a chunk is one request
        return start_run(tmp_path, env, [*args, "--task-runner", "dask", "--dask-address", address])

    fake_openai.reset()
    fake_openai.fail_when(lambda payload: {"delay_s": 1.0})
    two_workers = [ONE_WORKER, ONE_WORKER]
    with external_cluster(tmp_path / "first", env, two_workers) as cluster:
        first = run(cluster.address)
        wait_for_answers(fake_openai, first, 8, "scheduler's kill")
        os.killpg(cluster.scheduler.pid, signal.SIGKILL)
        stdout, stderr = first.communicate(timeout=180)
        for worker in cluster.workers:  # they end once their chunk tasks have
            worker.wait(timeout=120)
    time.sleep(1)
    assert first.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    objects = assert_counted_as_the_store_holds(
        stdout + stderr, 40, s3_client, s3_bucket, "orphans", fake_openai
    )

    fake_openai.fail_when(lambda payload: None)
    with external_cluster(tmp_path / "second", env, [ONE_WORKER]) as cluster:
        rerun = run(cluster.address)
        _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-3000:]
    assert f"{objects} of 40 chunks already published" in stderr, stderr[-3000:]
    assert max(fake_openai.charged_texts().values()) == 1
    assert len(fake_openai.charged_texts()) == len(rows)


def test_a_worker_closing_on_a_lost_scheduler_stops_its_chunks_and_keeps_what_they_paid(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    fake_openai: FakeEmbeddingServer,
) -> None:
    """A worker that loses its scheduler closes, and closing waits for its running tasks
    only so long (Dask: 30 s) before the process exits with whatever request is on the
    wire. Chunks longer than that (40 requests of 1 s) stop sending once their worker
    closes: the worker ends within a request or two, and the rerun pays for no text again."""
    env = cluster_env(moto_endpoint)
    rows = [(f"r{i:04d}", f"long chunk text {i}") for i in range(800)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    output = f"s3://{s3_bucket}/closing"

    def run(address: str) -> subprocess.Popen[str]:
        args = ["run", "in.csv", "--output", output, "--ledger", "ledger.sqlite3"]
        args += ["--embedder", "openai", "--base-url", fake_openai.base_url]
        args += ["--chunk-size", "400", "--batch-size", "10", "--grace", "5"]
        return start_run(tmp_path, env, [*args, "--task-runner", "dask", "--dask-address", address])

    fake_openai.reset()
    fake_openai.fail_when(lambda payload: {"delay_s": 1.0})
    with external_cluster(tmp_path / "first", env, [ONE_WORKER]) as cluster:
        first = run(cluster.address)
        wait_for_answers(fake_openai, first, 6, "scheduler's kill")
        os.killpg(cluster.scheduler.pid, signal.SIGKILL)
        killed = time.monotonic()
        first.communicate(timeout=180)
        cluster.workers[0].wait(timeout=120)
        closed_in = time.monotonic() - killed
    time.sleep(1.5)  # the fake charges a request in flight after its delay, client or not
    sent = sum(fake_openai.charged_texts().values())
    assert sent < len(rows), "the chunks finished before the kill: nothing was tested"
    assert closed_in < 20, f"the worker took {closed_in:.1f} s to close"

    fake_openai.fail_when(lambda payload: None)
    with external_cluster(tmp_path / "second", env, [ONE_WORKER]) as cluster:
        rerun = run(cluster.address)
        _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-3000:]
    charged = fake_openai.charged_texts()
    assert len(charged) == len(rows)
    assert max(charged.values()) == 1, sum(charged.values()) - len(rows)


def test_a_signal_while_waiting_for_a_lost_clusters_chunks_ends_with_the_summary(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    fake_openai: FakeEmbeddingServer,
) -> None:
    """The scheduler killed while its worker is frozen: the command waits up to ``--grace``
    for the chunks whose leases the worker holds. A Ctrl-C during that wait ends it as a
    Ctrl-C ends a run (it exited at once, without the summary or the published count)."""
    env = cluster_env(moto_endpoint)
    rows = [(f"r{i:03d}", f"waited text {i}") for i in range(200)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    args = ["run", "in.csv", "--output", f"s3://{s3_bucket}/waited", "--ledger", "l.sqlite3"]
    args += ["--embedder", "openai", "--base-url", fake_openai.base_url, "--grace", "120"]
    args += ["--chunk-size", "10", "--batch-size", "2", "--task-runner", "dask"]
    fake_openai.reset()
    fake_openai.fail_when(lambda payload: {"delay_s": 0.5})
    with external_cluster(tmp_path / "c", env, [ONE_WORKER]) as cluster:
        run = start_run(tmp_path, env, [*args, "--dask-address", cluster.address])
        waiting = threading.Event()
        err: list[str] = []

        def read() -> None:
            assert run.stderr is not None
            for line in run.stderr:
                err.append(line)
                if "the cluster went away with" in line:
                    waiting.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # chunks of 5 requests on 2 threads: answers 11-12 are the first of chunks 2 and 3,
        # so both threads are mid-chunk (their leases held) until answer 19
        wait_for_answers(fake_openai, run, 12, "scheduler's kill")
        os.killpg(cluster.workers[0].pid, signal.SIGSTOP)  # its chunks' leases stay held
        os.killpg(cluster.scheduler.pid, signal.SIGKILL)
        assert waiting.wait(120), "".join(err)[-3000:]
        run.send_signal(signal.SIGINT)
        out = run.stdout.read() if run.stdout else ""
        run.wait(timeout=60)
        reader.join(10)
    stderr = "".join(err)
    assert run.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert re.search(r"^chunks +\d+ published now", out, re.M), out + stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert re.search(r"interrupted by SIGINT: \d+ of 20 chunks published", last), last
