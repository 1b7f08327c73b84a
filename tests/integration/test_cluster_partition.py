"""A worker of a Dask cluster cut off the network mid-run (issue 40's partition) costs nothing
twice and is counted.

The cluster's machines are network namespaces (``tests/support/netns_cluster.py``): a
scheduler, two workers (each with its nanny, Dask's default), the user's CLI; the Prefect
server, S3 (moto) and the fake embeddings API on the bridge. Once requests are answered, the
bridge port of a worker running chunks goes down (``NetLab.partition``): its process keeps
running, its connections to the scheduler, S3 and the API hang, new ones fail; then it comes
back. Meanwhile the scheduler gives up on it (``worker-ttl``, then its nanny does not
answer), and runs its chunk task runs on the other worker while the first copies still run:
the test checks that this happened while the worker was cut off. Back on the network, the
removed worker learns it was removed and closes, its nanny with it (a worker a platform
does not restart is gone for good); its chunk threads run on until the nanny kills them.
Two lengths of cut, both past the scheduler's timeout:

- past the chunk lease (30 s, lease TTL 5 s): the second copy takes the lapsed lease and
  sends what the first did not keep; the first, once its request on the wire is answered,
  finds the chunk taken or published at its next check and sends nothing more;
- within the chunk lease (25 s, the default TTL 60 s): the second copy waits; the first,
  back in time, goes on as the holder, publishes, and takes the next chunks of its task run
  while the second waits for each and adopts it.

Either way the run ends as the failure guide says (exit 0, or exit 1 and "rerun the same
command"; the summary; no traceback), the summaries' inputs charged are what the fake
charged, no chunk has more than its one request on the wire (2 texts) paid twice, and every
vector read back from S3 is exact. With the lease's wait or its fence switched off, a chunk
is paid twice 14 texts deep. Slow (about 1.5 min a case here); skipped where namespaces
cannot be made.
"""

from __future__ import annotations

import contextlib
import csv
import io
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedline import read_embeddings
from tests.support.dask_cluster import (
    ended_as_documented,
    inputs_charged,
    paid_twice_per_chunk,
    wait_for_answers,
)
from tests.support.fake_openai import expected_vector
from tests.support.moto_server import DUMMY_AWS_ENV, make_s3_client
from tests.support.netns import NetHost
from tests.support.netns_cluster import (
    Machines,
    NetCluster,
    Services,
    aws_env,
    bridge_services,
    lab_machines,
    machine_env,
    netns_cluster,
    tails,
    worker_names,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUCKET = "partition"
CHUNK_ROWS = 20
BATCH = 2  # texts a request: what one request in flight may cost twice
WORKER_TTL_S = 8  # the scheduler gives up on a silent worker after this (checked as often)
CONNECT_S = 3  # the scheduler's connect timeout: how long it tries the worker's nanny


@dataclass(frozen=True)
class Cut:
    """One case: how long the worker is cut off, and the chunk lease's TTL (seconds)."""

    name: str
    cut_s: float
    lease_ttl_s: float


# Dask removes the cut-off worker 8-16 s (worker-ttl, checked every 8 s) + 3 s (its nanny
# not answering) into the cut: both cuts outlast that. Both stay under the client's 60 s
# request timeout: a request on the wire at the cut is answered once the network returns
# (TCP retransmits), not retried.
PAST_LEASE = Cut("past-lease", cut_s=30, lease_ttl_s=5)  # stale after 5 + 2.5 s
WITHIN_LEASE = Cut("within-lease", cut_s=25, lease_ttl_s=60)  # the default: 60 + 30 s


@pytest.fixture(scope="module")
def machines() -> Iterator[Machines]:
    with lab_machines("pa40") as machines:
        yield machines


@pytest.fixture(scope="module")
def services(machines: Machines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The servers on the bridge, shared by the cases; this process holds moto's dummy
    credentials and endpoint (to set up the bucket and read the output back)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in DUMMY_AWS_ENV.items():
            patch.setenv(name, value)
        home = tmp_path_factory.mktemp("prefect-server")
        with bridge_services(machines.lab, home) as services:
            patch.setenv("AWS_ENDPOINT_URL", services.s3_endpoint)
            make_s3_client(services.s3_endpoint).create_bucket(Bucket=BUCKET)
            yield services


def _cluster(
    machines: Machines, services: Services, home: Path, cut: Cut
) -> contextlib.AbstractContextManager[NetCluster]:
    """The cluster's context manager for ``cut``: 2 threads a worker (each with its nanny,
    Dask's default), the test's short ``worker-ttl`` and lease TTL."""
    return netns_cluster(
        machines,
        services,
        home,
        worker_args=("--nthreads", "2", "--preload", "tests.support.dask_warm"),
        worker_env={"EMBEDLINE_CHUNK_LEASE_TTL_S": str(cut.lease_ttl_s)},
        scheduler_env={
            "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": f"{WORKER_TTL_S}s",
            # a silent worker with a nanny is restarted through its nanny, and removed once
            # that fails: with the default 30 s connect timeout a 30 s cut ends before Dask
            # gives up on the worker (it then kills the worker once the network is back)
            "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": f"{CONNECT_S}s",
        },
    )


def _busy_worker(address: str) -> int:
    """The index (0 or 1) of a worker the scheduler has a task processing on."""
    from distributed import Client

    def processing(dask_scheduler: Any) -> dict[str, int]:
        workers = dask_scheduler.workers.values()
        return {str(ws.name): len(ws.processing) for ws in workers}

    with Client(address, timeout=10) as client:
        counts = client.run_on_scheduler(processing)
    return 0 if counts.get("w1") else 1


def _removals(address: str, ip: str) -> list[tuple[float, int]]:
    """When the scheduler removed the worker at ``ip`` (wall-clock seconds) and how many
    tasks it was processing then: those it runs again elsewhere (its ``remove-worker``
    events)."""
    from distributed import Client

    with Client(address, timeout=10) as client:
        events = client.get_events("all")
    return [
        (float(at), len(event.get("processing-tasks") or ()))
        for at, event in events
        if isinstance(event, dict)
        and event.get("action") == "remove-worker"
        and f"//{ip}:" in str(event.get("worker"))
    ]


def _settled(proc: subprocess.Popen[bytes], name: str, address: str, timeout_s: float) -> bool:
    """Whether, within ``timeout_s`` seconds, the worker ``name`` the scheduler removed is
    gone (``proc``, its ``dask worker``, exited: Dask closes a removed worker when it
    reaches the scheduler again, and its nanny with it) or back (its nanny got the
    scheduler's restart and a new worker joined): either way its first copies are over."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and name not in worker_names(address):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _requests_seen(fake: Any, path: Path, cut_at: float, healed_at: float) -> None:
    """Write what the fake saw (arrival relative to the cut, inputs, status), one request a
    line, to ``path``: what a failure here is read against."""
    now_wall, now_mono = time.time(), time.monotonic()
    with fake.lock:
        log = [dict(entry) for entry in fake.log]
    lines = [f"cut at 0.0 s, healed at {healed_at - cut_at:.1f} s"]
    for entry in log:
        at = entry["at"] - now_mono + now_wall - cut_at
        lines.append(f"{at:8.1f} {entry['n_inputs']} {entry['status']} {entry['idempotency_key']}")
    path.write_text("\n".join(lines) + "\n")


def _run(
    machines: Machines, services: Services, home: Path, address: str, output: str
) -> subprocess.Popen[str]:
    """``embedline run`` from the CLI's namespace against the cluster at ``address``."""
    env = {
        **machine_env(home / "cli-home"),
        **aws_env(services.s3_endpoint),
        "PREFECT_API_URL": services.api_url,
        "EMBEDLINE_API_KEY": "sk-cli",
    }
    args = ["run", f"s3://{BUCKET}/input/{home.name}.csv", "--output", output]
    args += ["--ledger", "ledger.sqlite3", "--embedder", "openai"]
    args += ["--base-url", services.fake.base_url, "--chunk-size", str(CHUNK_ROWS)]
    args += ["--batch-size", str(BATCH), "--concurrency", "4"]
    args += ["--task-runner", "dask", "--dask-address", address]
    return machines.lab.spawn(
        machines.client, [sys.executable, "-m", "cli", *args], env=env, cwd=home
    )


@pytest.mark.parametrize("cut", [PAST_LEASE, WITHIN_LEASE], ids=lambda c: c.name)
def test_a_worker_cut_off_mid_run_pays_nothing_twice_and_is_counted(
    machines: Machines, services: Services, tmp_path: Path, cut: Cut
) -> None:
    fake = services.fake
    rows = [(f"r{i:03d}", f"{cut.name} text {i}") for i in range(240)]
    body = io.StringIO()
    csv.writer(body, lineterminator="\n").writerows([("id", "text"), *rows])
    s3 = make_s3_client(services.s3_endpoint)
    s3.put_object(Bucket=BUCKET, Key=f"input/{tmp_path.name}.csv", Body=body.getvalue().encode())
    output = f"s3://{BUCKET}/{cut.name}"
    fake.reset()
    fake.fail_when(lambda payload: {"delay_s": 0.4})  # chunks in flight when the cut comes
    summaries = 0

    with _cluster(machines, services, tmp_path / "first", cut) as cluster:
        address = machines.address
        first = _run(machines, services, tmp_path, address, output)
        wait_for_answers(fake, first, 12, "cut")
        victim = _busy_worker(address)
        host: NetHost = machines.workers[victim]
        with machines.lab.partition(host):
            cut_at = time.time()
            time.sleep(cut.cut_s)
        healed_at = time.time()
        out, err = first.communicate(timeout=300)
        (tmp_path / "first.txt").write_text(f"{first.returncode}\n{out}\n{err}")
        ended_as_documented(first, out, err)
        # the scenario: Dask gave up on the worker while it was cut off and runs its
        # chunks elsewhere, the first copies still running
        removals = _removals(address, host.ip)
        assert any(cut_at < at < healed_at and n for at, n in removals), (
            removals,
            cut_at,
            healed_at,
            tails(cluster.logs),
        )
        # back on the network, the cut-off copy finishes what it was doing (its request in
        # flight, a lease it finds taken) until Dask closes or restarts its worker
        name = f"w{victim + 1}"
        assert _settled(cluster.workers[victim], name, address, 120), tails(cluster.logs)
        time.sleep(3)  # a spend record the copy wrote on its way out
        summaries += inputs_charged(out + err)
        _requests_seen(fake, tmp_path / "requests.txt", cut_at, healed_at)
        assert paid_twice_per_chunk(fake, rows, CHUNK_ROWS) <= BATCH, (out + err)[-4000:]

    if first.returncode == 1:
        fake.fail_when(None)
        with _cluster(machines, services, tmp_path / "second", cut) as cluster:
            rerun = _run(machines, services, tmp_path, machines.address, output)
            out, err = rerun.communicate(timeout=300)
        (tmp_path / "rerun.txt").write_text(f"{rerun.returncode}\n{out}\n{err}")
        assert rerun.returncode == 0, (out + err)[-4000:]
        summaries += inputs_charged(out + err)

    charged = sum(fake.charged_texts().values())
    assert summaries == charged, f"summaries {summaries}, the fake charged {charged}: {tmp_path}"
    frame = read_embeddings(output)
    got = dict(zip(frame["id"], frame["embedding"], strict=True))
    assert sorted(got) == [row_id for row_id, _ in rows]
    for row_id, text in rows:
        assert np.allclose(got[row_id], expected_vector(text), atol=1e-6)
    assert paid_twice_per_chunk(fake, rows, CHUNK_ROWS) <= BATCH
    assert max(fake.charged_texts().values()) <= 2
