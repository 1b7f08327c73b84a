"""A Dask cluster started apart, as a user's platform starts one: a ``dask scheduler`` and
``dask worker`` processes of their own on 127.0.0.1, each in its own session (killed as a
group at the end, whatever happens), with the environment the test gives; and an
``embedline run`` started against it. For the tests of ``--dask-address``
(tests/integration/test_dask_external.py, test_dask_faults.py, test_dask_worker_faults.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.fixtures import REPO

__all__ = [
    "ExternalCluster",
    "dask_process",
    "ended_as_documented",
    "external_cluster",
    "inputs_charged",
    "kill_group",
    "paid_twice_per_chunk",
    "start_run",
    "wait_for",
    "wait_for_answers",
    "worker_count",
]


@dataclass(frozen=True)
class ExternalCluster:
    """A running cluster: the scheduler's address, its process, the workers' processes (a
    nanny's, in one process group with its worker, unless started with ``--no-nanny``)."""

    address: str
    scheduler: subprocess.Popen[bytes]
    workers: tuple[subprocess.Popen[bytes], ...]


def dask_process(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``dask ARGS`` (the CLI beside this Python) in a session of its own, output to ``log``."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("dask")), *args],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # killed as a group at the end, whatever happens
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (a nanny and its worker) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def wait_for(ready: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``ready`` every 0.3 s until it is true.

    :raises TimeoutError: not within ``timeout_s`` seconds (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up in {timeout_s} s")
        time.sleep(0.3)


def worker_count(address: str) -> int:
    """How many workers the scheduler at ``address`` has."""
    from distributed import Client

    with Client(address, timeout=10) as client:
        return len(client.scheduler_info()["workers"])


@contextlib.contextmanager
def external_cluster(
    home: Path,
    env: dict[str, str],
    worker_args: Sequence[Sequence[str]],
) -> Iterator[ExternalCluster]:
    """A scheduler and one worker per item of ``worker_args`` (each worker's own options
    after ``dask worker ADDRESS --no-dashboard --host 127.0.0.1``), logs in ``home``
    (created); yields once every worker has joined, kills them all at the end."""
    home.mkdir(parents=True, exist_ok=True)
    scheduler_file = home / "scheduler.json"
    args = ["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
    scheduler = dask_process([*args, "--scheduler-file", str(scheduler_file)], env, home / "s.log")
    procs = [scheduler]
    try:
        wait_for(scheduler_file.exists, 60, "the scheduler's file")
        address = json.loads(scheduler_file.read_text())["address"]
        for n, own in enumerate(worker_args):
            worker = ["worker", address, "--no-dashboard", "--host", "127.0.0.1", *own]
            procs.append(dask_process(worker, env, home / f"w{n}.log"))
        wait_for(lambda: worker_count(address) == len(worker_args), 90, "the workers")
        yield ExternalCluster(address, scheduler, tuple(procs[1:]))
    finally:
        for proc in reversed(procs):
            kill_group(proc)


def start_run(cwd: Path, env: dict[str, str], args: Sequence[str]) -> subprocess.Popen[str]:
    """``embedline ARGS`` (``python -m cli``) in ``cwd`` with ``env``, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def inputs_charged(output: str) -> int:
    """The ``N inputs charged`` of the last summary in a command's ``output``.

    :raises AssertionError: no summary line says it.
    """
    found = re.findall(r"([\d,]+) inputs? charged", output)
    assert found, output[-3000:]
    return int(found[-1].replace(",", ""))


def wait_for_answers(fake: Any, run: subprocess.Popen[str], answered: int, what: str) -> None:
    """Wait (up to 120 s) until the fake server has answered ``answered`` requests of
    ``run``, so a fault injected next finds chunks in flight; fail the test with the run's
    output if it ends first or the time passes (``what``: the fault, for the message)."""
    deadline = time.monotonic() + 120
    while fake.answered < answered:
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            out, err = run.communicate()
            pytest.fail(f"the run ended before the {what}: {(out + err)[-3000:]}")
        time.sleep(0.1)


def ended_as_documented(proc: subprocess.Popen[str], out: str, err: str) -> None:
    """Assert that a finished run ended as the failure guide says a fault does: exit 0, or
    exit 1 with "rerun the same command"; no traceback in its output."""
    assert "Traceback" not in out + err, (out + err)[-4000:]
    assert proc.returncode in (0, 1), (out + err)[-4000:]
    if proc.returncode == 1:
        assert "rerun the same command" in err, (out + err)[-4000:]


def paid_twice_per_chunk(fake: Any, rows: Sequence[tuple[str, str]], chunk_size: int) -> int:
    """The most texts of one chunk (``rows`` as ``(id, text)``, in file order, ``chunk_size``
    rows a chunk) that ``fake`` (a ``FakeEmbeddingServer``: its ``charged_texts()``)
    charged more than once. A copy of a chunk that dies, stops or is cut off mid-chunk
    leaves at most its request in flight (``--batch-size`` texts) to be paid again; a chunk
    paid again whole is ``chunk_size``."""
    charged = fake.charged_texts()
    twice = [
        n // chunk_size
        for n, (_, text) in enumerate(rows)
        if charged[hashlib.sha256(text.encode()).hexdigest()] > 1
    ]
    return max((twice.count(c) for c in set(twice)), default=0)


def cluster_env(moto_endpoint: str, **more: str) -> dict[str, str]:
    """The environment of a test's scheduler, workers and ``embedline`` command: this
    checkout on the path, S3 at the moto server, the fake's API key; ``more`` on top."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AWS_ENDPOINT_URL": moto_endpoint,
        "EMBEDLINE_API_KEY": "sk-test",
        **more,
    }


def assert_read_back_exact(
    output: str, rows: Sequence[tuple[str, str]], moto_endpoint: str, monkeypatch: Any
) -> None:
    """Every ``(id, text)`` of ``rows`` reads back from run ``output`` (on the moto server)
    once, with the fake server's vector for its text (``expected_vector``)."""
    import numpy as np

    from embedline import read_embeddings
    from tests.support.fake_openai import expected_vector

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    frame = read_embeddings(output)
    got = dict(zip(frame["id"], frame["embedding"], strict=True))
    assert sorted(got) == sorted(a for a, _ in rows)
    for row_id, text in rows:
        assert np.allclose(got[row_id], expected_vector(text), atol=1e-6), row_id


def assert_counted_as_the_store_holds(
    output: str, chunks: int, s3_client: Any, bucket: str, prefix: str, fake: Any
) -> int:
    """Assert that a stopped run's ``output`` (its stdout and stderr) says as many of its
    ``chunks`` are "published and kept" as the store holds chunk objects under ``prefix``
    (``s3://bucket/prefix``; at least one, else nothing was tested), and that its summary's
    inputs charged equal what ``fake`` (a ``FakeEmbeddingServer``) charged. Returns the
    count of chunk objects."""
    last = output.strip().splitlines()[-1]
    found = re.search(rf"; (\d+) of {chunks} chunks are published and kept", last)
    assert found, last
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/chunks/")
    objects = len(listed.get("Contents", []))
    assert objects > 0, "no chunk was published before the fault: nothing was tested"
    assert int(found.group(1)) == objects, output[-6000:]
    assert inputs_charged(output) == sum(fake.charged_texts().values())
    return objects
