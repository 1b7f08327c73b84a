"""``run --dask-address`` against a cluster started apart, as a user's platform starts one: a
``dask scheduler`` and a ``dask worker`` as processes of their own (on loopback), with the
worker's own environment. What cannot work is refused in one line and seconds; what a
worker lacks is named at warm-up; the worker's profiler is off before any chunk."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import dask_cluster
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli

pytestmark = pytest.mark.integration

_KEYS = ("EMBEDLINE_API_KEY", "OPENAI_API_KEY")


@dataclass(frozen=True)
class Cluster:
    address: str
    worker_name: str


@pytest.fixture(scope="module")
def external_cluster(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str
) -> Iterator[Cluster]:
    """A scheduler and one worker (name ``w-nokey``), on 127.0.0.1, the worker with the AWS
    settings of the moto server but no API key, Dask's default settings otherwise (its
    profiler on)."""
    home = tmp_path_factory.mktemp("dask-external")
    env = _worker_env(str(REPO), moto_endpoint)
    env.pop("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", None)
    worker = ["--name", "w-nokey", "--nthreads", "2", "--nworkers", "1"]
    with dask_cluster.external_cluster(home, env, [[*worker, "--local-directory", str(home)]]) as c:
        yield Cluster(c.address, "w-nokey")


def _profiler_running(address: str) -> list[bool]:
    """Whether each worker's statistical profiler (its periodic callbacks) runs."""
    from distributed import Client

    with Client(address, timeout=10) as client:
        return list(client.run(_profiler_callbacks_running).values())


def _profiler_callbacks_running(dask_worker: Any) -> bool:
    callbacks = dask_worker.periodic_callbacks
    return any(
        callbacks[name].is_running() for name in ("profile", "profile-cycle") if name in callbacks
    )


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "in.csv"
    path.write_text("id,text\n" + "".join(f"r{i},text {i}\n" for i in range(6)))
    return path


def _run(
    tmp_path: Path, address: str, bucket: str, *extra: str, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = run_cli(
        "run",
        str(_csv(tmp_path)),
        "--output",
        f"s3://{bucket}/ext",
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--task-runner",
        "dask",
        "--dask-address",
        address,
        *extra,
        cwd=tmp_path,
        env=env,
        timeout=240,
    )
    return result, time.monotonic() - started


def _worker_env(pythonpath: str, moto_endpoint: str) -> dict[str, str]:
    """A worker's environment: this one without an API key, ``PYTHONPATH`` and the S3
    endpoint of the moto server."""
    env = {k: v for k, v in os.environ.items() if k not in _KEYS}
    env.update(PYTHONPATH=pythonpath, AWS_ENDPOINT_URL=moto_endpoint)
    return env


def _error_lines(stderr: str) -> list[str]:
    """The ``embedline: error:`` lines of a command's standard error."""
    return [x for x in stderr.splitlines() if x.startswith("embedline: error:")]


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    return lines[0]


def test_without_prefect_api_url_a_cluster_by_address_is_refused_in_one_line(
    tmp_path: Path,
    external_cluster: Cluster,
    moto_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    result, took = _run(
        tmp_path,
        external_cluster.address,
        s3_bucket,
        env={"AWS_ENDPOINT_URL": moto_endpoint},
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert took < 10
    line = _one_line(result.stderr)
    assert "PREFECT_API_URL" in line and "workers can reach" in line


def test_an_unreachable_scheduler_is_refused_in_seconds(
    tmp_path: Path, prefect_api_url: str, moto_endpoint: str, s3_bucket: str
) -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result, took = _run(
        tmp_path, f"tcp://127.0.0.1:{port}", s3_bucket, env={"AWS_ENDPOINT_URL": moto_endpoint}
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert took < 10
    assert "no Dask scheduler reached" in _one_line(result.stderr)


def test_an_http_server_at_the_address_is_refused_in_seconds(
    tmp_path: Path,
    prefect_api_url: str,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
) -> None:
    """A port where something other than a scheduler listens accepted the TCP connect: the
    run hung (an HTTP server never answers Dask), or failed after a minute with a traceback."""
    port = fake_openai.base_url.split(":")[-1].split("/")[0]
    result, took = _run(
        tmp_path, f"tcp://127.0.0.1:{port}", s3_bucket, env={"AWS_ENDPOINT_URL": moto_endpoint}
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert took < 30
    line = _one_line(result.stderr)
    assert "no Dask scheduler reached" in line and "no Dask answer" in line


def test_a_worker_without_the_api_key_stops_the_run_naming_it_and_runs_no_profiler(
    tmp_path: Path,
    external_cluster: Cluster,
    prefect_api_url: str,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
) -> None:
    assert _profiler_running(external_cluster.address) == [True]  # Dask's default
    result, _ = _run(
        tmp_path,
        external_cluster.address,
        s3_bucket,
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        env={"AWS_ENDPOINT_URL": moto_endpoint, "EMBEDLINE_API_KEY": "sk-flow-only"},
    )
    assert result.returncode == 3, result.stderr[-3000:]  # a setting to fix (failures guide)
    assert "Traceback" not in result.stderr
    named = _error_lines(result.stderr)
    assert len(named) == 1, result.stderr[-3000:]
    assert "w-nokey" in named[0] and "EMBEDLINE_API_KEY" in named[0]
    assert "sk-flow-only" not in result.stderr
    assert fake_openai.answered == 0  # no chunk ran
    assert _profiler_running(external_cluster.address) == [False]  # stopped at warm-up


def test_a_scheduler_without_workers_stops_the_run_in_one_line_after_its_wait(
    tmp_path: Path,
    prefect_api_url: str,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
) -> None:
    """A scheduler with no worker: the run printed "progress 0 of N" for ever (and a rerun
    with every chunk published waited for a worker to show its cached task runs). Now it
    waits for a first worker (``EMBEDLINE_DASK_WORKER_WAIT_S``), then stops in one line,
    exit 3; with nothing left to embed it commits without one."""
    env = _worker_env(str(REPO), moto_endpoint)
    with dask_cluster.external_cluster(tmp_path / "empty", env, []) as empty:
        args = ("--embedder", "openai", "--base-url", fake_openai.base_url)
        wait = {"AWS_ENDPOINT_URL": moto_endpoint, "EMBEDLINE_DASK_WORKER_WAIT_S": "2"}
        result, took = _run(tmp_path, empty.address, s3_bucket, *args, env=wait)
        assert result.returncode == 3, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and took < 60
        named = _error_lines(result.stderr)
        assert len(named) == 1 and "has no workers (waited 2 s)" in named[0], result.stderr
        assert fake_openai.answered == 0
        # every chunk published, the manifest not (a run killed at its commit): nothing to
        # embed, so the cluster's rerun commits without a worker
        ran = run_cli(
            *_run_args(tmp_path, s3_bucket), *args, cwd=tmp_path, env={**os.environ, **wait}
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        _drop_manifests(moto_endpoint, s3_bucket)
        done, _ = _run(tmp_path, empty.address, s3_bucket, *args, env=wait)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "status     complete" in done.stdout, done.stdout[-3000:]


def _run_args(tmp_path: Path, bucket: str) -> list[str]:
    """``_run``'s command line without the cluster (threads)."""
    return [
        "run", str(_csv(tmp_path)), "--output", f"s3://{bucket}/ext",
        "--ledger", str(tmp_path / "other.sqlite3"),  # another machine's
    ]  # fmt: skip


def _drop_manifests(endpoint: str, bucket: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for item in s3.list_objects_v2(Bucket=bucket, Prefix="ext/manifests/").get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=item["Key"])


def test_a_worker_without_embedline_stops_the_run_in_one_line(
    tmp_path: Path,
    prefect_api_url: str,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
) -> None:
    """A worker whose Python lacks embedline failed the run with a traceback at warm-up (or
    hung it: the worker stays registered once its plugin fails)."""
    env = _worker_env(str(REPO / "tests" / "support" / "no_embedline"), moto_endpoint)
    with dask_cluster.external_cluster(tmp_path / "bare", env, [("--nthreads", "1")]) as bare:
        args = ("--embedder", "openai", "--base-url", fake_openai.base_url)
        result, took = _run(
            tmp_path, bare.address, s3_bucket, *args, env={"AWS_ENDPOINT_URL": moto_endpoint}
        )
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and took < 90
    named = _error_lines(result.stderr)
    assert len(named) == 1, result.stderr[-3000:]
    assert "cannot load embedline's code (No module named" in named[0]
    assert fake_openai.answered == 0


@pytest.mark.parametrize(
    "stale",
    [
        "api key",
        # CI's 20-minute budget: the second half of the family runs with -m slow (make test-all)
        pytest.param("s3 endpoint", marks=pytest.mark.slow),
    ],
)
def test_a_setting_refused_on_one_worker_is_named_with_that_worker(
    tmp_path: Path,
    stale: str,
    request: pytest.FixtureRequest,
    prefect_api_url: str,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
) -> None:
    """A worker whose environment holds a stale value the warm-up cannot judge (an API key
    the API answers 401, another S3 server, without the output's bucket): the stop line said to
    check EMBEDLINE_API_KEY or the bucket, which in the shell that started the run are
    right. Now it names the worker the chunk ran on; no key is ever printed."""
    fake_openai.require_key = "sk-right"
    env = {**_worker_env(str(REPO), moto_endpoint), "EMBEDLINE_API_KEY": "sk-right"}
    flow = {"AWS_ENDPOINT_URL": moto_endpoint, "EMBEDLINE_API_KEY": "sk-right"}
    worker = ("--name", "w-stale", "--nthreads", "1")
    if stale == "api key":
        env["EMBEDLINE_API_KEY"], expected = "sk-stale", "check EMBEDLINE_API_KEY"
    else:  # a server of its own: moto's state is shared by every moto in this process
        env["AWS_ENDPOINT_URL"] = request.getfixturevalue("ministack_endpoint")
        expected = "NoSuchBucket"
    with dask_cluster.external_cluster(tmp_path / "stale", env, [worker]) as cluster:
        args = ("--embedder", "openai", "--base-url", fake_openai.base_url)
        result, _ = _run(tmp_path, cluster.address, s3_bucket, *args, env=flow)
    assert result.returncode == 3, result.stderr[-3000:]  # a setting to fix
    assert "Traceback" not in result.stderr
    named = _error_lines(result.stderr)
    assert len(named) == 1, result.stderr[-3000:]
    assert expected in named[0], named[0]
    assert re.search(r"ran on Dask worker tcp://127\.0\.0\.1:\d+ \(w-stale\)", named[0]), named[0]
    assert "sk-stale" not in result.stderr + result.stdout
    assert "sk-right" not in result.stderr + result.stdout
