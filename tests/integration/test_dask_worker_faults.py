"""A worker of a Dask cluster that dies or stalls mid-run costs nothing twice and is counted:
a worker SIGKILLed mid-run (its nanny starts a new one, Dask runs its chunks again) and a
worker SIGSTOPped past the scheduler's timeout (no nanny kills it: Dask runs its chunks
elsewhere while the first copies still hold them; SIGCONT wakes them) each end with the
summary, exit 0 or "rerun to resume" with exit 1, no traceback; the summary's inputs charged
are the fake server's charged count; a rerun completes with every vector exact and no text
charged twice but those of a request in flight at the fault. The scheduler and workers are
processes of their own, as a user's platform starts them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.dask_cluster import (
    assert_counted_as_the_store_holds,
    assert_read_back_exact,
    cluster_env,
    ended_as_documented,
    external_cluster,
    inputs_charged,
    paid_twice_per_chunk,
    start_run,
    wait_for_answers,
)
from tests.support.fake_openai import FakeEmbeddingServer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("prefect_api_url"),
    pytest.mark.slow,  # a cluster of three processes, two runs each: make test-all runs it
]


def _workers(nanny: bool) -> list[tuple[str, ...]]:
    """Two workers of 2 threads each (``nanny``: each with a nanny, which starts a new worker
    when one dies, and kills one the scheduler gave up on)."""
    own = ("--nthreads", "2", *(() if nanny else ("--no-nanny",)))
    preload = ("--preload", "tests.support.dask_warm")  # before the short worker-ttl
    return [(*own, *preload, "--name", f"w{n}") for n in range(2)]


def _worker_pids(address: str) -> list[int]:
    from distributed import Client

    with Client(address, timeout=10) as client:
        return sorted(client.run(os.getpid).values())


def _env(moto_endpoint: str) -> dict[str, str]:
    return cluster_env(
        moto_endpoint,
        EMBEDLINE_CHUNK_LEASE_TTL_S="4",  # a stalled copy's lease lapses in 4 s + 2 s
        DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL="8s",  # gives up on a silent worker
    )


def _start(tmp_path: Path, env: dict[str, str], address: str, base_url: str, output: str) -> Any:
    args = ["run", "in.csv", "--output", output, "--ledger", "ledger.sqlite3"]
    args += ["--embedder", "openai", "--base-url", base_url]
    args += ["--chunk-size", "20", "--batch-size", "2", "--concurrency", "4"]
    return start_run(tmp_path, env, [*args, "--task-runner", "dask", "--dask-address", address])


def _scenario(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    fake: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    env = _env(moto_endpoint)
    rows = [(f"r{i:03d}", f"{fault} text {i}") for i in range(240)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    output = f"s3://{s3_bucket}/{fault}"
    fake.reset()
    fake.fail_when(lambda payload: {"delay_s": 0.4})
    with external_cluster(tmp_path / "first", env, _workers(nanny=fault == "kill")) as cluster:
        address = cluster.address
        first = _start(tmp_path, env, address, fake.base_url, output)
        wait_for_answers(fake, first, 12, "fault")
        victim = _worker_pids(address)[0]
        if fault == "kill":
            os.kill(victim, signal.SIGKILL)
        else:
            os.kill(victim, signal.SIGSTOP)
            time.sleep(20)  # past the scheduler's 8 s and the chunk lease's 4 s + 2 s
            os.kill(victim, signal.SIGCONT)
        out, err = first.communicate(timeout=300)
        ended_as_documented(first, out, err)
        time.sleep(3)  # a woken copy may still be asking its fenced lease
        charged = sum(fake.charged_texts().values())
        assert inputs_charged(out + err) == charged, (out + err)[-4000:]
        # one kill has been seen to cost a chunk two copies' requests in flight (Dask ran it
        # again on the worker being replaced): 2 requests of 2 texts
        assert paid_twice_per_chunk(fake, rows, 20) <= 4, (out + err)[-4000:]

    fake.fail_when(None)
    with external_cluster(tmp_path / "second", env, _workers(nanny=True)) as cluster:
        rerun = _start(tmp_path, env, cluster.address, fake.base_url, output)
        out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, (out + err)[-4000:]
    assert_read_back_exact(output, rows, moto_endpoint, monkeypatch)
    assert paid_twice_per_chunk(fake, rows, 20) <= 4
    assert max(fake.charged_texts().values()) <= 2


def test_a_worker_killed_mid_run_is_counted_and_costs_nothing_twice(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    fake_openai: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _scenario(tmp_path, moto_endpoint, s3_bucket, fake_openai, monkeypatch, "kill")


def test_a_worker_paused_past_the_scheduler_timeout_does_not_pay_again_when_woken(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    fake_openai: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _scenario(tmp_path, moto_endpoint, s3_bucket, fake_openai, monkeypatch, "pause")


def test_a_cluster_that_loses_its_last_worker_stops_the_run_in_one_line(
    tmp_path: Path,
    moto_endpoint: str,
    s3_bucket: str,
    s3_client: Any,
    fake_openai: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its only worker SIGKILLed with its nanny, the scheduler alive: every chunk task run
    waited for a worker that never came, and the command printed "progress 0 of N" for
    ever. Now, after the worker wait (5 s here), one line names the scheduler and says to
    start workers and rerun: exit 1, no traceback; its count of chunks published and kept is
    the store's (it said 0 while the worker had published chunks of a group task that never
    returned), and so is the summary's charge; the rerun on a cluster with a worker
    finishes, every vector exact."""
    env = {**_env(moto_endpoint), "EMBEDLINE_DASK_WORKER_WAIT_S": "5"}
    rows = [(f"r{i:03d}", f"last worker text {i}") for i in range(200)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    output = f"s3://{s3_bucket}/no-workers"
    args = ["run", "in.csv", "--output", output, "--ledger", "ledger.sqlite3"]
    args += ["--embedder", "openai", "--base-url", fake_openai.base_url]
    args += ["--chunk-size", "10", "--batch-size", "5", "--task-runner", "dask"]

    fake_openai.reset()
    fake_openai.fail_when(lambda payload: {"delay_s": 0.5})
    with external_cluster(tmp_path / "first", env, [("--nthreads", "2")]) as cluster:
        run = start_run(tmp_path, env, [*args, "--dask-address", cluster.address])
        wait_for_answers(fake_openai, run, 6, "worker's kill")  # 2 chunks of a group
        os.killpg(cluster.workers[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = run.communicate(timeout=120)
        ended_in = time.monotonic() - killed
    assert run.returncode == 1, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert f"the Dask scheduler at {cluster.address} has had no workers for 5 s" in last, last
    assert "rerun the same command to resume" in last and "dask worker" in last, last
    assert ended_in < 60, f"the run ended {ended_in:.0f} s after its last worker"
    assert_counted_as_the_store_holds(
        out + err, 20, s3_client, s3_bucket, "no-workers", fake_openai
    )

    fake_openai.fail_when(lambda payload: None)
    with external_cluster(tmp_path / "second", env, [("--nthreads", "2")]) as cluster:
        rerun = start_run(tmp_path, env, [*args, "--dask-address", cluster.address])
        _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert_read_back_exact(output, rows, moto_endpoint, monkeypatch)
