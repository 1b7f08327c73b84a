"""A Dask cluster on separate machines, as far as the network goes, for the tests that need
one (tests/integration/test_cluster_netns.py, test_cluster_partition.py): a ``dask
scheduler`` and two ``dask worker``s, each in its own network namespace
(``tests/support/netns.py``), working directory and environment, none able to reach the
host's loopback; a namespace for a user's CLI; and the Prefect server, the S3 server (moto)
and the fake embeddings API on the host's address on the namespaces' bridge, as servers on
a network are.

Everything started here is stopped when its context ends, and the lab kills whatever is
left in a namespace when it is torn down (``net_lab``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.moto_server import DUMMY_AWS_ENV, MotoS3Server
from tests.support.netns import NetHost, NetLab, net_lab
from tests.support.prefect_server import start_prefect_server

__all__ = [
    "BIN",
    "SCHEDULER_PORT",
    "Machines",
    "NetCluster",
    "Services",
    "aws_env",
    "bridge_services",
    "lab_machines",
    "machine_env",
    "netns_cluster",
    "tails",
    "worker_names",
]

SCHEDULER_PORT = 8786
#: This interpreter's scripts (``dask``, ``prefect``): the same tools on every machine.
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Machines:
    """The lab and its namespaces: the scheduler's, two workers', a user's CLI's."""

    lab: NetLab
    scheduler: NetHost
    workers: tuple[NetHost, NetHost]
    client: NetHost  # where a user's CLI runs

    @property
    def address(self) -> str:
        """The scheduler's address, ``tcp://IP:8786``."""
        return f"tcp://{self.scheduler.ip}:{SCHEDULER_PORT}"


@contextlib.contextmanager
def lab_machines(tag: str) -> Iterator[Machines]:
    """A lab (``net_lab(tag)``: skips where namespaces cannot be made) with the namespaces
    ``sched``, ``w1``, ``w2`` and ``cli``; torn down at the end."""
    with net_lab(tag) as lab:
        yield Machines(lab, lab.add("sched"), (lab.add("w1"), lab.add("w2")), lab.add("cli"))


def machine_env(home: Path) -> dict[str, str]:
    """A machine's own environment: this interpreter's tools, the checkout on the path (the
    same package on every machine), its own home (created); nothing of the test process."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "HF_HUB_OFFLINE": "1",
    }


def aws_env(endpoint: str) -> dict[str, str]:
    """moto's dummy credentials and ``AWS_ENDPOINT_URL=endpoint``."""
    return {**DUMMY_AWS_ENV, "AWS_ENDPOINT_URL": endpoint}


@dataclass(frozen=True)
class Services:
    """What the machines reach on the bridge: the Prefect API, S3, the fake embeddings API
    (in this process: its counters are the truth of what was charged)."""

    api_url: str
    s3_endpoint: str
    fake: FakeEmbeddingServer
    home: Path


@contextlib.contextmanager
def bridge_services(lab: NetLab, home: Path) -> Iterator[Services]:
    """A Prefect server (SQLite in ``home``, created), moto and the fake API on the bridge's
    host address; all stopped at the end. The caller holds moto's dummy credentials in its
    environment to set up and read the bucket."""
    home.mkdir(parents=True, exist_ok=True)
    proc, api_url = start_prefect_server(home, host=lab.host_ip)
    try:
        with (
            MotoS3Server(host=lab.host_ip) as s3,
            FakeEmbeddingServer(host=lab.host_ip) as fake,
        ):
            yield Services(api_url, s3.endpoint, fake, home)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass(frozen=True)
class NetCluster:
    """A running cluster: its processes (``ip netns exec`` leaders: scheduler first, then a
    worker per worker namespace) and their logs, in that order."""

    procs: tuple[subprocess.Popen[bytes], ...]
    logs: tuple[Path, ...]

    @property
    def workers(self) -> tuple[subprocess.Popen[bytes], ...]:
        """The workers' processes, in the order of ``Machines.workers``."""
        return self.procs[1:]


@contextlib.contextmanager
def netns_cluster(
    machines: Machines,
    services: Services,
    home: Path,
    *,
    worker_args: Sequence[str] = ("--nthreads", "3"),
    worker_env: Mapping[str, str] | None = None,
    scheduler_env: Mapping[str, str] | None = None,
) -> Iterator[NetCluster]:
    """``dask scheduler`` and a ``dask worker`` (named ``w1``, ``w2``, with ``worker_args``)
    in each worker namespace, each with its own directory under ``home`` and its own
    environment (``machine_env``): the workers hold the API key and the S3 settings, as the
    cluster guide says, plus ``worker_env``; the scheduler ``scheduler_env``. Dask's
    default settings otherwise. Yields once both workers have joined; kills every process
    group at the end.

    :raises pytest.fail.Exception: the cluster is not up within 90 s (the logs' tails).
    """
    lab, logs, procs = machines.lab, [], []
    sched_home = home / "sched"
    logs.append(sched_home / "scheduler.log")
    sched_args = ["scheduler", "--host", machines.scheduler.ip, "--port", str(SCHEDULER_PORT)]
    try:
        procs.append(
            lab.popen(
                machines.scheduler,
                [str(BIN / "dask"), *sched_args, "--no-dashboard"],
                env={**machine_env(sched_home), **(scheduler_env or {})},
                cwd=sched_home,
                log=logs[-1],
            )
        )
        for i, worker in enumerate(machines.workers, 1):
            worker_home = home / f"w{i}"
            env = {
                **machine_env(worker_home),
                **aws_env(services.s3_endpoint),
                "EMBEDLINE_API_KEY": "sk-w",
                **(worker_env or {}),
            }
            logs.append(worker_home / "worker.log")
            own = ["--name", f"w{i}", *worker_args, "--host", worker.ip, "--no-dashboard"]
            procs.append(
                lab.popen(
                    worker,
                    [str(BIN / "dask"), "worker", machines.address, *own],
                    env=env,
                    cwd=worker_home,
                    log=logs[-1],
                )
            )
        deadline = time.monotonic() + 90
        while worker_names(machines.address) != ["w1", "w2"]:
            dead = [p.args for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                pytest.fail(f"cluster not up ({dead}): {tails(logs)}")
            time.sleep(0.5)
        yield NetCluster(tuple(procs), tuple(logs))
    finally:
        for proc in procs:  # the lab kills them too, at its end
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def worker_names(address: str) -> list[str]:
    """The names of the workers the scheduler at ``address`` has, sorted ([] if it does not
    answer)."""
    from distributed import Client

    try:
        with Client(address, timeout=5) as client:
            workers = client.scheduler_info()["workers"].values()
            return sorted(str(w.get("name")) for w in workers)
    except OSError:
        return []


def tails(logs: Sequence[Path]) -> str:
    """The last 2,000 characters of each log that exists, each under its path."""
    return "\n".join(
        f"--- {log}\n{log.read_text(errors='replace')[-2000:]}" for log in logs if log.exists()
    )
