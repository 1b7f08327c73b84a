"""A Dask cluster on separate machines, as far as the network goes: a ``dask scheduler`` and two
``dask worker``s, each in its own network namespace (``tests/support/netns.py``), working
directory and environment, none able to reach the host's loopback. The Prefect server, the S3
server (moto) and the fake embeddings API listen on the host's address on the namespaces'
bridge, as servers on a network do.

- From a namespace, what cannot work is refused in one line before Prefect starts: a loopback
  ``PREFECT_API_URL``, none, a scheduler that does not answer.
- The ``embed-csv/cluster-address`` sample of ``deployments/prefect.yaml``, deployed to a
  Prefect server bound to the bridge and run by a process worker with the scheduler's
  address: input and output on S3, every vector exact, each distinct text charged once, the
  chunks run by both workers; the same run deployed by file (the ``manual`` sample) is
  refused in one line, nothing sent. Slow (over two minutes here: a Prefect server of its
  own, a cluster, two flow runs).

Skipped with the reason ``ip`` gives where namespaces cannot be made (not root, a container
without CAP_SYS_ADMIN).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.fake_openai import expected_vector
from tests.support.fixtures import REPO
from tests.support.moto_server import DUMMY_AWS_ENV, make_s3_client
from tests.support.netns_cluster import (
    Machines,
    Services,
    aws_env,
    bridge_services,
    lab_machines,
    machine_env,
    netns_cluster,
    tails,
)
from tests.support.output import vectors_by_id
from tests.support.prefect_server import (
    param_arguments,
    start_prefect_worker,
    stop_prefect_worker,
)

pytestmark = pytest.mark.integration

POOL = "embedline-local"  # the pool of deployments/prefect.yaml's samples
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture(scope="module")
def machines() -> Iterator[Machines]:
    with lab_machines("cl40") as machines:
        yield machines


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    return lines[0]


def test_from_another_machine_what_cannot_work_is_refused_in_one_line(
    machines: Machines, tmp_path: Path
) -> None:
    (tmp_path / "in.csv").write_text("id,text\na,one\n")
    env = machine_env(tmp_path / "home")
    run = ["run", "in.csv", "--output", "s3://bucket/out", "--task-runner", "dask"]
    cases = (
        # (PREFECT_API_URL, address, what the line says)
        ("http://127.0.0.1:4200/api", machines.address, "PREFECT_API_URL is on loopback"),
        (None, machines.address, "temporary Prefect server listens on this machine's loopback"),
        (
            f"http://{machines.lab.host_ip}:4200/api",
            f"tcp://{machines.scheduler.ip}:9",  # a machine that answers, no scheduler there
            "no Dask scheduler reached (connection refused)",
        ),
    )
    for api_url, address, said in cases:
        case_env = {**env, **({"PREFECT_API_URL": api_url} if api_url else {})}
        started = time.monotonic()
        result = machines.lab.run(
            machines.client,
            [sys.executable, "-m", "cli", *run, "--dask-address", address],
            env=case_env,
            cwd=tmp_path,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr[-3000:]
        assert time.monotonic() - started < 15
        line = _one_line(result.stderr)
        assert said in line and address in line, line


# ── the whole path: a deployment, a cluster of three machines, S3 ─────────────────────────


@pytest.fixture
def services(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Services]:
    """The Prefect server (SQLite), moto and the fake API on the host's bridge address; this
    process holds moto's dummy credentials (to set up and read the bucket)."""
    for name, value in DUMMY_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    with bridge_services(machines.lab, tmp_path / "prefect-server") as services:
        yield services


@pytest.fixture
def cluster(machines: Machines, services: Services, tmp_path: Path) -> Iterator[list[Path]]:
    """``dask scheduler`` and two ``dask worker``s (3 threads each) on Dask's default
    settings (the profiler on), as ``netns_cluster`` starts them. Yields the logs."""
    with netns_cluster(machines, services, tmp_path) as cluster:
        yield list(cluster.logs)


def _executed(address: str) -> dict[str, int]:
    """Tasks each worker has run, by name."""
    from distributed import Client

    with Client(address, timeout=10) as client:
        info = client.scheduler_info()["workers"]
        counts = client.run(lambda dask_worker: dask_worker.state.executed_count)
        return {str(info[a]["name"]): n for a, n in counts.items()}


def _prefect(api_url: str, *args: str) -> str:
    env = {**os.environ, "PREFECT_API_URL": api_url, "COLUMNS": "200"}
    env.pop("EMBEDLINE_REPO", None)  # the sample's build step records the checkout
    result = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _wait_terminal(api_url: str, flow_run_id: str, logs: list[Path]) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        run = httpx.get(f"{api_url}/flow_runs/{flow_run_id}", timeout=10).json()
        if run["state_type"] in TERMINAL:
            return dict(run)
        time.sleep(0.5)
    pytest.fail(f"flow run {flow_run_id} not finished in 240 s:\n{tails(logs)}")


def _flow_logs(api_url: str, flow_run_id: str) -> list[str]:
    response = httpx.post(
        f"{api_url}/logs/filter",
        json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200},
        timeout=10,
    )
    return [str(entry["message"]) for entry in response.json()]


def _rows() -> list[tuple[str, str]]:
    """36 rows, 24 distinct texts (every third text repeats an earlier one)."""
    return [(f"r{i:02d}", f"cluster text {i if i % 3 else i // 3}") for i in range(36)]


@pytest.mark.slow
def test_a_deployment_drives_a_cluster_of_separate_machines_exactly_once(
    machines: Machines, services: Services, cluster: list[Path], tmp_path: Path
) -> None:
    rows = _rows()
    s3 = make_s3_client(services.s3_endpoint)
    s3.create_bucket(Bucket="cluster")
    body = io.StringIO()
    csv.writer(body, lineterminator="\n").writerows([("id", "text"), *rows])
    s3.put_object(Bucket="cluster", Key="input/in.csv", Body=body.getvalue().encode())

    # ── the sample deployment, as the cluster guide deploys it ─────────────────────────────
    api = services.api_url
    _prefect(api, "work-pool", "create", POOL, "--type", "process", "--overwrite")
    _prefect(
        api,
        "--no-prompt",
        "deploy",
        "--prefect-file",
        "deployments/prefect.yaml",
        "--name",
        "cluster-address",
    )
    sample = httpx.get(f"{api}/deployments/name/embed-csv/cluster-address", timeout=10).json()
    assert sample["parameters"]["limits"]["task_runner"] == "dask"

    # the pool's worker, on the host: it hands its PREFECT_API_URL (the bridge's) to flow runs
    worker_env = {
        **aws_env(services.s3_endpoint),
        "PREFECT_API_URL": api,
        "EMBEDLINE_API_KEY": "sk-flow",
    }
    worker = start_prefect_worker(POOL, tmp_path / "prefect-worker.log", env=worker_env)
    logs = [tmp_path / "prefect-worker.log", *cluster]
    try:
        params = {
            "input": "s3://cluster/input/in.csv",
            "embedder": "openai",
            "base_url": services.fake.base_url,
            "task_runner": "dask",
            "dask_address": machines.address,
            "chunk_size": 4,
            "concurrency": 5,
            "output": "s3://cluster/out",
            "ledger": str(tmp_path / "ledger.sqlite3"),
        }
        started = _prefect(
            api, "deployment", "run", "embed-csv/cluster-address", *param_arguments(params)
        )
        match = re.search(r"UUID: ([0-9a-f-]{36})", started)
        assert match, started
        run = _wait_terminal(api, match.group(1), logs)
        messages = _flow_logs(api, match.group(1))
        assert run["state_type"] == "COMPLETED", f"{run['state_name']}:\n{tails(logs)}"
        assert any("task runner ready: dask, 2 workers" in m for m in messages), messages
        charged_once = services.fake.charged_texts()

        # the same run from a deployment by file (the manual sample): refused in one line
        _prefect(
            api,
            "--no-prompt",
            "deploy",
            "--prefect-file",
            "deployments/prefect.yaml",
            "--name",
            "manual",
        )
        by_file = {**params, "output": "s3://cluster/by-file"}
        started = _prefect(api, "deployment", "run", "embed-csv/manual", *param_arguments(by_file))
        match = re.search(r"UUID: ([0-9a-f-]{36})", started)
        assert match, started
        refused = _wait_terminal(api, match.group(1), logs)
    finally:
        stop_prefect_worker(worker)
    assert refused["state_type"] == "FAILED"
    assert "loaded from its file as module 'embed_csv'" in refused["state"]["message"]
    assert services.fake.charged_texts() == charged_once  # nothing sent

    # ── every vector exact, each distinct text paid once, both machines worked ───────────
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="cluster", Prefix="out/")["Contents"]]
    (manifest_key,) = [k for k in keys if "/manifests/" in k]
    manifest = json.loads(s3.get_object(Bucket="cluster", Key=manifest_key)["Body"].read())
    bodies = {
        e["object"]: s3.get_object(Bucket="cluster", Key=f"out/{e['object']}")["Body"].read()
        for e in manifest["chunks"]
    }
    vectors = vectors_by_id(bodies, manifest)
    assert sorted(vectors) == sorted(row_id for row_id, _ in rows)
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)
    distinct = {text for _, text in rows}
    charged = services.fake.charged_texts()
    assert charged == {hashlib.sha256(t.encode()).hexdigest(): 1 for t in distinct}
    executed = _executed(machines.address)
    assert set(executed) == {"w1", "w2"} and all(executed.values()), executed
