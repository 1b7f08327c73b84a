"""deployments/prefect.yaml for real: deploy to a Prefect server, run on a process worker,
fail 3 of 20 chunks with 503s, heal the API, retry the flow run as the UI does, and check that
the retry embedded only the failed chunks and published every row exactly once."""

from __future__ import annotations

import csv
import math
import os
import re
import signal
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
from tests.support.forked_cli import run_cli_process
from tests.support.output import read_local_output
from tests.support.prefect_server import (
    param_arguments,
    start_prefect_worker,
    stop_prefect_worker,
)

pytestmark = pytest.mark.integration

POOL = "embedline-local"  # the work pool named in deployments/prefect.yaml
MARKER = "FAIL-UNTIL-HEALED"
CHUNK_SIZE, BATCH_SIZE, ROWS = 5, 2, 98  # 20 chunks, the last one of 3 rows
FAILING_ROWS = (12, 57, 96)  # in chunks 2, 11 and 19
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _prefect(*args: str, timeout: float = 120) -> str:
    """Run ``prefect ARGS`` from the repository root; return stdout, fail on non-zero exit."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("EMBEDLINE_REPO", None)  # the deploy's build step falls back to the checkout
    result = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def failing_api(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A fake embeddings server in its own process: 503 for texts holding MARKER until healed.

    Yields ``(base_url, control_url)``.
    """
    yield from _fake_api("--fail-texts-containing", MARKER, "--fail-status", "503")


def _fake_api(*options: str) -> Iterator[tuple[str, str]]:
    """Run ``tests.support.fake_openai OPTIONS`` in its own process; yield (base_url, control)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_openai", "--port", "0", *options],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        base_url = line.split()[1]
        yield base_url, base_url.removesuffix("/v1") + "/control"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


@pytest.fixture
def worker(prefect_api_url: str, tmp_path: Path) -> Iterator[Path]:
    """The process work pool and a worker polling it; yields the worker's log file."""
    _prefect("work-pool", "create", POOL, "--type", "process", "--overwrite")
    log = tmp_path / "worker.log"
    proc = start_prefect_worker(POOL, log)
    try:
        yield log
    finally:
        stop_prefect_worker(proc)


def _write_csv(path: Path) -> list[tuple[str, str]]:
    rows = [
        (f"pkg-{i:03d}", f'package {i}: tools for task {i * 7}, "quoted"\nline two')
        for i in range(ROWS)
    ]
    for i in FAILING_ROWS:
        rows[i] = (rows[i][0], f"{rows[i][1]} {MARKER}")
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(("id", "text"))
        writer.writerows(rows)
    return rows


def _flow_run(api: str, flow_run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=10)
    response.raise_for_status()
    return dict(response.json())


def _wait_terminal(api: str, flow_run_id: str, log: Path, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = _flow_run(api, flow_run_id)
        if run["state_type"] in TERMINAL:
            return run
        time.sleep(0.25)
    pytest.fail(
        f"flow run {flow_run_id} still {run['state_name']} after {timeout} s; worker "
        f"log:\n{log.read_text(errors='replace')[-4000:]}"
    )


def _chunk_task_runs(api: str, flow_run_id: str, expected: int) -> list[tuple[str, str]]:
    """``(name, state name)`` of the run's chunk task runs, waiting up to 15 s for ``expected``
    (the server records task run states from events, a moment after the flow run ends)."""
    deadline = time.monotonic() + 15
    while True:
        response = httpx.post(
            f"{api}/task_runs/filter",
            timeout=10,
            json={"flow_runs": {"id": {"any_": [flow_run_id]}}},
        )
        found = [t for t in response.json() if t["name"].startswith("embed-chunk-")]
        runs = [(t["name"], t["state_name"]) for t in found]
        settled = all(t["state_type"] in TERMINAL for t in found)
        if (len(runs) >= expected and settled) or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def _log(control: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{control}/counters", timeout=10).json()["log"])


def test_retry_of_a_failed_deployment_run_embeds_only_the_failed_chunks(
    prefect_api_url: str, worker: Path, failing_api: tuple[str, str], tmp_path: Path
) -> None:
    api = prefect_api_url
    base_url, control = failing_api
    rows = _write_csv(tmp_path / "in.csv")
    out, ledger = tmp_path / "out", tmp_path / "ledger.sqlite3"

    # ── deploy both deployments of the file, as the README does ───────────────────────────
    _prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
    nightly = httpx.get(f"{api}/deployments/name/embed-csv/nightly", timeout=10).json()
    manual = httpx.get(f"{api}/deployments/name/embed-csv/manual", timeout=10).json()
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == ["30 2 * * *"]
    assert manual["schedules"] == []
    gc = httpx.get(f"{api}/deployments/name/gc-output/gc-weekly", timeout=10).json()
    assert [(s["schedule"]["cron"], s["active"]) for s in gc["schedules"]] == [
        ("0 4 * * 0", False)
    ]  # weekly, inactive until switched on
    assert gc["entrypoint"] == "flows/gc_output.py:gc_output"
    for deployment, strategy in ((nightly, "CANCEL_NEW"), (manual, "ENQUEUE")):
        assert deployment["global_concurrency_limit"]["limit"] == 1
        assert deployment["concurrency_options"]["collision_strategy"] == strategy
        assert deployment["entrypoint"] == "flows/embed_csv.py:embed_csv"
        assert deployment["work_pool_name"] == POOL
        assert deployment["pull_steps"] == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ]
        assert deployment["parameters"]["source"]["input"] == "examples/debian-sample.csv"
        assert "limits" not in deployment["parameters"]  # the sample runs with the defaults

    # ── run it with per-run parameters: 3 of 20 chunks get 503s ───────────────────────────
    params = {
        "input": tmp_path / "in.csv",
        "output": out,
        "ledger": ledger,
        "embedder": "openai",
        "base_url": base_url,
        "chunk_size": CHUNK_SIZE,
        "batch_size": BATCH_SIZE,
        "chunk_retries": 0,
        "max_attempts": 1,
        "timeout": 5,
    }
    args = param_arguments(params)
    started = _prefect("deployment", "run", "embed-csv/manual", *args)
    match = re.search(r"UUID: ([0-9a-f-]{36})", started)
    assert match, started
    flow_run_id = match.group(1)
    first = _wait_terminal(api, flow_run_id, worker)
    assert first["state_type"] == "FAILED", first["state"]
    assert first["state"]["message"].startswith("3 of 20 chunks not published")
    # no command to rerun here: the UI's Retry (below) resumes it
    assert first["state"]["message"].endswith(
        "; run it again (Retry on the flow run's page in the UI) to retry only those chunks"
    )
    assert "rerun the same command" not in first["state"]["message"]
    assert not (out / "manifests").exists()
    requests_before = len(_log(control))

    # ── heal the API, retry the flow run (what the UI's "Retry" does), wait ───────────────
    httpx.post(f"{control}/heal", timeout=10).raise_for_status()
    retried_at = time.monotonic()
    _prefect("flow-run", "retry", flow_run_id)
    final = _wait_terminal(api, flow_run_id, worker)
    retry_s = time.monotonic() - retried_at
    assert final["state_type"] == "COMPLETED", final["state"]
    assert final["run_count"] == 2
    print(f"\nretry -> Completed: {retry_s:.1f} s")
    # the Failed attempt's logs: its one line, not Prefect's engine re-raising the run's
    # result with a traceback after it (40 lines that buried the line)
    logs = _flow_run_logs(api, flow_run_id)
    assert "3 of 20 chunks not published" in logs
    assert "Traceback" not in logs, logs[-3000:]

    # ── the retry embedded what the failed chunks had not paid for, and nothing else ─────
    # (the first attempt's successful requests of those chunks were kept: tasks/embed/paid.py)
    failed_chunks = sorted({i // CHUNK_SIZE for i in FAILING_ROWS})
    chunk_rows = [min(CHUNK_SIZE, ROWS - c * CHUNK_SIZE) for c in failed_chunks]
    most = sum(math.ceil(n / BATCH_SIZE) for n in chunk_rows)  # 3 + 3 + 2: whole chunks
    log = _log(control)
    retry_requests = log[requests_before:]
    print(f"requests: first run {requests_before}, retry {len(retry_requests)}")
    assert len(failed_chunks) <= len(retry_requests) <= most == 8
    assert all(entry["status"] == 200 for entry in retry_requests)
    assert sum(entry["n_inputs"] for entry in retry_requests) <= sum(chunk_rows)
    paid = sum(entry["n_inputs"] for entry in log if entry["status"] == 200)
    assert paid == ROWS  # every text paid for exactly once over the attempt and its retry

    # Prefect reran the whole flow function (it skips no task run: results are not
    # persisted); the flow embedded only the 3 failed chunks and showed the 17 published ones
    # as "Cached" task runs. So the run holds 20 chunk task runs from each attempt.
    chunk_runs = _chunk_task_runs(api, flow_run_id, expected=40)
    failed_names = [f"embed-chunk-{c:04d}" for c in failed_chunks]
    by_state = {
        state: sorted(n for n, s in chunk_runs if s == state)
        for state in ("Failed", "Cached", "Completed")
    }
    assert by_state["Failed"] == failed_names
    assert by_state["Cached"] == sorted(
        f"embed-chunk-{c:04d}" for c in range(20) if c not in failed_chunks
    )
    assert by_state["Completed"] == [f"embed-chunk-{c:04d}" for c in range(20)]
    assert len(chunk_runs) == 40

    # ── the manifest is committed and every id is published once, with its own vector ─────
    manifest, vectors = read_local_output(out)  # asserts no id appears twice
    assert manifest["rows_published"] == ROWS and manifest["rows_failed"] == 0
    assert sorted(vectors) == sorted(row_id for row_id, _ in rows)
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)


@pytest.fixture
def slow_api() -> Iterator[tuple[str, str]]:
    """A fake embeddings server whose every answer takes 2.5 s. Yields (base_url, control)."""
    yield from _fake_api("--delay-s", "2.5")


def _flow_run_logs(api: str, flow_run_id: str) -> str:
    response = httpx.post(
        f"{api}/logs/filter",
        timeout=10,
        json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_ASC"},
    )
    response.raise_for_status()
    return "\n".join(entry["message"] for entry in response.json())


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_a_deployment_run_cancelled_from_the_ui_ends_cancelled_quietly_and_in_time(
    prefect_api_url: str, worker: Path, slow_api: tuple[str, str], tmp_path: Path
) -> None:
    """The UI's Cancel (``prefect flow-run cancel``): the runner sends SIGTERM (and SIGKILL
    30 s later). In-flight chunks (25 s each) get their grace, are released and recorded, and
    the run ends Cancelled, with no traceback and exit 0. Before: Failed proposed into
    Cancelling, an UnfinishedRun traceback, exit 1. (The grace's cap below the SIGKILL:
    tests/unit/flows/test_signals.py.)"""
    api, (base_url, control) = prefect_api_url, slow_api
    _write_csv(tmp_path / "in.csv")
    ledger = tmp_path / "ledger.sqlite3"
    _prefect(
        "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--name", "manual"
    )
    params = {
        "input": tmp_path / "in.csv",
        "output": tmp_path / "out",
        "ledger": ledger,
        "embedder": "openai",
        "base_url": base_url,
        "chunk_size": 20,
        "batch_size": 1,
        "concurrency": 2,
        "grace": 4,
    }  # ≥ 10 requests of 2.5 s per chunk
    args = param_arguments(params)
    started = _prefect("deployment", "run", "embed-csv/manual", *args)
    match = re.search(r"UUID: ([0-9a-f-]{36})", started)
    assert match, started
    flow_run_id = match.group(1)
    deadline = time.monotonic() + 90
    while not _log(control):  # chunks are in flight
        assert time.monotonic() < deadline, worker.read_text(errors="replace")[-4000:]
        time.sleep(0.2)
    time.sleep(1.0)
    _prefect("flow-run", "cancel", flow_run_id)
    cancelled_at = time.monotonic()
    final = _wait_terminal(api, flow_run_id, worker, timeout=60)
    took = time.monotonic() - cancelled_at
    print(f"\ncancel -> {final['state_name']}: {took:.1f} s")
    assert final["state_type"] == "CANCELLED", final["state"]
    assert took < 30  # the process ended before the runner's SIGKILL (worker log below)

    deadline, logs = time.monotonic() + 15, ""
    while "stopped: interrupted by SIGTERM" not in logs and time.monotonic() < deadline:
        time.sleep(0.5)
        logs = _flow_run_logs(api, flow_run_id)
    assert "in-flight chunks get 4 s to finish" in logs, logs
    assert "released" in logs, logs
    assert "Flow run was cancelled." in logs, logs  # Prefect's own cancellation ran
    assert "stopped: interrupted by SIGTERM: 0 of 5 chunks published; a new run" in logs, logs
    for noise in ("Traceback", "UnfinishedRun", "Engine execution exited"):
        assert noise not in logs, logs
    worker_log = worker.read_text(errors="replace")
    for code in ("status code: 1", "status code: -9"):  # a general error; SIGKILL
        assert code not in worker_log, worker_log[-4000:]
    status = run_cli_process(
        [sys.executable, "-m", "cli", "status", "--ledger", str(ledger)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "interrupted" in status.stdout, status.stdout + status.stderr


@pytest.fixture
def held_batch_api() -> Iterator[str]:
    """A fake Batch API in its own process whose batches take 10 minutes. Yields its URL."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fake_batch",
            "--port",
            "0",
            "--dims",
            "8",
            "--complete-after-s",
            "600",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


@pytest.mark.slow  # a worker and a deployment run (~40 s): make test-all runs it
def test_a_batch_deployment_run_cancelled_while_waiting_ends_cancelled_and_names_cancel_batches(
    prefect_api_url: str, worker: Path, held_batch_api: str, tmp_path: Path
) -> None:
    """The UI's Cancel while a --batch-api run waits for its batches: the runner's SIGTERM
    stops the wait at once (nothing in flight to wait for), the run ends Cancelled without a
    traceback, and its log says the batches keep running and how to cancel them."""
    api = prefect_api_url
    _write_csv(tmp_path / "in.csv")
    _prefect(
        "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--name", "manual"
    )
    params = {
        "input": tmp_path / "in.csv",
        "output": tmp_path / "out",
        "ledger": tmp_path / "ledger.sqlite3",
        "embedder": "openai",
        "base_url": held_batch_api,
        "chunk_size": 50,
        "batch_api": True,
        "batch_poll_interval": 0.5,
    }
    args = param_arguments(params)
    started = _prefect("deployment", "run", "embed-csv/manual", *args)
    match = re.search(r"UUID: ([0-9a-f-]{36})", started)
    assert match, started
    flow_run_id = match.group(1)
    deadline = time.monotonic() + 90
    # the chunks' requests packed in one batch
    while "batches: 1 in_progress" not in _flow_run_logs(api, flow_run_id):  # waiting
        assert time.monotonic() < deadline, worker.read_text(errors="replace")[-4000:]
        time.sleep(0.5)
    _prefect("flow-run", "cancel", flow_run_id)
    cancelled_at = time.monotonic()
    final = _wait_terminal(api, flow_run_id, worker, timeout=60)
    assert final["state_type"] == "CANCELLED", final["state"]
    assert time.monotonic() - cancelled_at < 30  # before the runner's SIGKILL
    deadline, logs = time.monotonic() + 15, ""
    while "cancel-batches" not in logs and time.monotonic() < deadline:
        time.sleep(0.5)
        logs = _flow_run_logs(api, flow_run_id)
    assert (
        "1 batch keeps running at the provider (billed when they complete): a new run "
        "with the same parameters (or a Retry) collects them"
    ) in logs, logs
    assert "`embedline cancel-batches " in logs, logs
    for noise in ("Traceback", "UnfinishedRun", "Engine execution exited"):
        assert noise not in logs, logs


@pytest.mark.slow  # a worker, a deploy and two deployment runs (~90 s): make test-all
def test_a_manual_run_beside_the_nightly_one_waits_for_it_and_pays_no_text_twice(
    prefect_api_url: str, worker: Path, tmp_path: Path
) -> None:
    """The ``nightly`` and the ``manual`` deployment of one output at once (two deployments:
    their concurrency limits do not meet), each on its own ledger as on two workers: the
    later flow run waits for the earlier one's lease, then copies what it published
    (tasks/lease/overlap.py); the fake server's charges are the judge."""
    from tests.support.fake_openai import FakeEmbeddingServer

    api = prefect_api_url
    nightly_rows = [(f"pkg-{i:03d}", f"package {i}: tools for task {i * 7}") for i in range(40)]
    manual_rows = nightly_rows[10:] + [(f"pkg-new{i}", f"a new package {i}") for i in range(5)]
    for name, rows in (("nightly", nightly_rows), ("manual", manual_rows)):
        with (tmp_path / f"{name}.csv").open("w", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerows([("id", "text"), *rows])
    out = tmp_path / "out"
    _prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
    with FakeEmbeddingServer(dims=384) as server:
        server.fail_when(lambda payload: {"delay_s": 0.6})  # 20 requests one at a time
        ids = {}
        for name in ("nightly", "manual"):
            params = {
                "input": tmp_path / f"{name}.csv",
                "output": out,
                "ledger": tmp_path / f"{name}.sqlite3",
                "embedder": "openai",
                "base_url": server.base_url,
                "chunk_size": 5,
                "batch_size": 2,
                "concurrency": 1,
            }
            args = param_arguments(params)
            started = _prefect("deployment", "run", f"embed-csv/{name}", *args)
            match = re.search(r"UUID: ([0-9a-f-]{36})", started)
            assert match, started
            ids[name] = match.group(1)
            if name == "nightly":  # the manual run starts while the nightly one embeds
                deadline = time.monotonic() + 120
                while server.counters()["requests"] < 1:
                    assert time.monotonic() < deadline, worker.read_text(errors="replace")
                    time.sleep(0.2)
        ends = {name: _wait_terminal(api, i, worker, timeout=240) for name, i in ids.items()}
        charged = server.charged_texts()
    for name, run in ends.items():
        assert run["state_type"] == "COMPLETED", (name, run["state"])
    assert "waiting for run " in _flow_run_logs(api, ids["manual"])
    texts = {text for _, text in nightly_rows + manual_rows}
    assert len(charged) == len(texts) and max(charged.values()) == 1, charged.most_common(3)
    manifests = sorted((out / "manifests").glob("*.json"))
    assert len(manifests) == 2


def test_serve_py_serves_every_deployment_of_prefect_yaml_and_runs_one(
    prefect_api_url: str, failing_api: tuple[str, str], tmp_path: Path
) -> None:
    """deployments/serve.py as deployments/README.md runs it: every deployment of
    prefect.yaml, each with its own entrypoint's flow (before, gc-weekly was built with
    embed_csv and the server's 422 stopped serve.py at start), and a run it serves completes."""
    from tests.support.processes import die_with_parent

    api, (base_url, _control) = prefect_api_url, failing_api
    with (tmp_path / "in.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerows([("id", "text"), *((f"p{i}", f"text {i}\nline two") for i in range(30))])
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "deployments/serve.py"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    try:
        deadline = time.monotonic() + 60
        names: dict[str, Any] = {}
        while len(names) < 7:
            assert serve.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
            found = httpx.post(f"{api}/deployments/filter", timeout=10, json={}).json()
            names = {d["name"]: d for d in found if d["name"].endswith("-served")}
        assert sorted(names) == [
            "cluster-address-served",
            "cluster-kubernetes-served",
            "gc-weekly-served",
            "load-after-commit-served",
            "manual-served",
            "nightly-batch-served",
            "nightly-served",
        ]
        gc = names["gc-weekly-served"]
        assert gc["entrypoint"] == "flows/gc_output.py:gc_output"
        assert [s["active"] for s in gc["schedules"]] == [False]
        assert [s["active"] for s in names["nightly-served"]["schedules"]] == [True]

        params = {
            "input": tmp_path / "in.csv",
            "output": tmp_path / "out",
            "ledger": tmp_path / "ledger.sqlite3",
            "embedder": "openai",
            "base_url": base_url,
            "chunk_size": 10,
        }
        args = param_arguments(params)
        started = _prefect("deployment", "run", "embed-csv/manual-served", *args)
        match = re.search(r"UUID: ([0-9a-f-]{36})", started)
        assert match, started
        final = _wait_terminal(api, match.group(1), log)
        assert final["state_type"] == "COMPLETED", final["state"]
        manifest, vectors = read_local_output(tmp_path / "out")
        assert manifest["rows_published"] == 30 and len(vectors) == 30
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C, as the README stops it
        try:
            serve.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()


def test_the_server_runs_on_postgresql_and_its_ui_talks_to_its_own_port(
    prefect_api_url: str, pg_uri: str
) -> None:
    """The session's server is started as deployments/README.md says (deployments/server.py:
    PostgreSQL, a port of its own): what the API writes lands in PostgreSQL, and the UI is
    told to call this port's API, not 4200's (it showed "Can't connect to Server API at
    http://127.0.0.1:4200/api" when started with --port before PREFECT_API_URL was set)."""
    import psycopg

    name = f"pg-probe-{os.getpid()}-{time.monotonic_ns()}"
    httpx.post(f"{prefect_api_url}/flows/", json={"name": name}, timeout=10).raise_for_status()
    with psycopg.connect(pg_uri, autocommit=True) as db:
        databases = [
            r[0]
            for r in db.execute("SELECT datname FROM pg_database WHERE datname LIKE 'prefect_%'")
        ]
    found = []
    for database in databases:
        with psycopg.connect(pg_uri.replace("/postgres?", f"/{database}?"), autocommit=True) as db:
            found += db.execute("SELECT name FROM flow WHERE name = %s", (name,)).fetchall()
    assert found == [(name,)]
    ui = httpx.get(prefect_api_url.removesuffix("/api") + "/ui-settings", timeout=10).json()
    assert ui["api_url"] == prefect_api_url


def test_server_py_gives_the_ui_its_own_port_even_with_a_stale_api_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A profile's PREFECT_API_URL saved for port 4200 (README step 2, done before) and a
    server moved to 4371: Prefect's own resolution (the setting ``/ui-settings`` serves)
    picks 4200; deployments/server.py's environment picks 4371."""
    from prefect.settings.models.root import Settings

    from deployments.server import server_env

    def resolved(env: dict[str, str]) -> tuple[str | None, int]:
        with monkeypatch.context() as m:
            for key in [k for k in os.environ if k.startswith("PREFECT_")]:
                m.delenv(key)
            for key, value in env.items():
                if key.startswith("PREFECT_"):
                    m.setenv(key, value)
            settings = Settings()
            return settings.server.ui.api_url, settings.server.api.port

    stale = {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}
    assert resolved(stale) == ("http://127.0.0.1:4200/api", 4200)  # the pitfall
    assert resolved(server_env(stale, port=4371)) == ("http://127.0.0.1:4371/api", 4371)
    # bound to every interface: the UI asks the host the browser loaded it from
    assert resolved(server_env(stale, host="0.0.0.0", port=4371)) == ("/api", 4371)
