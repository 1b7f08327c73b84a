"""``embedline run`` cancelled from Prefect (the UI's Cancel, ``prefect flow-run cancel``).

Before: the cancel was ignored (Prefect acts on a cancel only for runs a runner started),
every chunk was embedded and committed, then the CLI died with ``UnfinishedRun: Run is in
CANCELLING state`` (exit 1, traceback, empty stdout) and the run stayed Cancelling forever.
Now it stops as a SIGTERM does and the flow run ends Cancelled (Completed when the cancel
came after the commit). One configured Prefect server for the session (``prefect_api_url``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.forked_cli import popen_cli, run_cli_process
from tests.support.s3_proxy import ResettingProxy

pytestmark = pytest.mark.integration

ROWS, CHUNK, GRACE_S = 240, 4, 3  # 60 chunks; at 0.5 s a request, 2 in flight: 15 s of work
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _run_args(fake: FakeEmbeddingServer, output: str, ledger: Path) -> list[str]:
    return [
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake.base_url,
        "--output",
        output,
        "--ledger",
        str(ledger),
        "--chunk-size",
        str(CHUNK),
        "--concurrency",
        "2",
        "--grace",
        str(GRACE_S),
        "--chunk-retries",
        "0",
        "--progress-interval",
        "0",
    ]


def _write_csv(tmp_path: Path, rows: int = ROWS) -> None:
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},text {i}\n" for i in range(rows)))


def _ledger_of(flow_run: dict[str, Any]) -> object:
    """The ``destination.ledger`` parameter of an embed-csv flow run (None if not given)."""
    return flow_run["parameters"].get("destination", {}).get("ledger")


def _find_flow_run(api: str, ledger: Path, proc: subprocess.Popen[str]) -> str:
    """The id of the running ``embed-csv`` flow run whose ``ledger`` parameter is ours, found
    through the API as a user finds it in the UI."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = httpx.post(
            f"{api}/flow_runs/filter",
            timeout=10,
            json={
                "flows": {"name": {"any_": ["embed-csv"]}},
                "flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}},
            },
        ).json()
        mine = [r["id"] for r in found if _ledger_of(r) == str(ledger)]
        if mine:
            return str(mine[0])
        time.sleep(0.2)
    pytest.fail("the run's flow run never showed up Running")


def _cancel(api: str, flow_run_id: str) -> None:
    """What the UI's Cancel sends (``prefect flow-run cancel`` sends the same state)."""
    response = httpx.post(
        f"{api}/flow_runs/{flow_run_id}/set_state",
        timeout=10,
        json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": False},
    )
    assert response.json()["status"] == "ACCEPT", response.text


def _final_state(api: str, flow_run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        run = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=10).json()
        if run["state_type"] in TERMINAL or time.monotonic() > deadline:
            return dict(run)
        time.sleep(0.2)


def _history(api: str, flow_run_id: str) -> list[str]:
    states = httpx.get(
        f"{api}/flow_run_states/", params={"flow_run_id": flow_run_id}, timeout=10
    ).json()
    return [s["type"] for s in sorted(states, key=lambda s: s["timestamp"])]


def _embedline_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("embedline:")]


def _status(cwd: Path, ledger: Path) -> str:
    done = run_cli_process(
        [sys.executable, "-m", "cli", "status", "--ledger", str(ledger)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


def test_a_run_cancelled_from_prefect_stops_like_sigterm_ends_cancelled_and_resumes(
    prefect_api_url: str, fake_openai: FakeEmbeddingServer, tmp_path: Path
) -> None:
    api, ledger = prefect_api_url, tmp_path / "ledger.sqlite3"
    _write_csv(tmp_path)
    fake_openai.fail_when(lambda payload: {"delay_s": 0.5})
    proc = _cli(*_run_args(fake_openai, "out", ledger), cwd=tmp_path)
    try:
        flow_run_id = _find_flow_run(api, ledger, proc)
        deadline = time.monotonic() + 60
        while not list((tmp_path / "out").glob("chunks/*.parquet")):
            assert time.monotonic() < deadline and proc.poll() is None, "no chunk was published"
            time.sleep(0.1)
        cancel = subprocess.run(
            [sys.executable, "-m", "prefect", "flow-run", "cancel", flow_run_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        cancelled_at = time.monotonic()
        out, err = proc.communicate(timeout=60)
        stopped_s = time.monotonic() - cancelled_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"\ncancel -> exit {proc.returncode}: {stopped_s:.1f} s")
    assert proc.returncode == 143, err[-3000:]
    assert stopped_s < GRACE_S + 5  # 1 s poll + in-flight requests (0.5 s), not the whole run
    assert "Traceback" not in err and "UnfinishedRun" not in err, err[-3000:]
    published = len(list((tmp_path / "out").glob("chunks/*.parquet")))
    assert 1 <= published < ROWS // CHUNK
    line = (
        f"embedline: cancelled from Prefect: {published} of {ROWS // CHUNK} chunks "
        "published; rerun the same command to resume"
    )
    assert _embedline_lines(err) == [line] and err.strip().splitlines()[-1] == line, err[-3000:]
    assert "status     interrupted: cancelled from Prefect" in out, out
    assert f"rows       {published * CHUNK} published of {ROWS}" in out, out
    assert fake_openai.counters()["requests"] < ROWS // CHUNK  # not every chunk was embedded
    final = _final_state(api, flow_run_id)
    assert final["state_type"] == "CANCELLED", final["state"]
    assert final["state"]["message"] == line.removeprefix("embedline: ")
    status = _status(tmp_path, ledger)
    assert "\tinterrupted\t" in status and " running=0 " in status, status
    assert not (tmp_path / "out" / "manifests").exists()

    # the rerun sends only the rows of chunks not published, and commits
    fake_openai.reset()
    rerun = run_cli_process(
        [sys.executable, "-m", "cli", *_run_args(fake_openai, "out", ledger)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert fake_openai.counters()["inputs"] == ROWS - published * CHUNK
    assert "status     complete" in rerun.stdout, rerun.stdout


@contextmanager
def _ended(proc: subprocess.Popen[str], hold: _Hold) -> Iterator[None]:
    """Whatever the body asserts, the held request is let go and the CLI does not outlive
    the test."""
    try:
        yield
    finally:
        hold.release.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _cancel_then_release(
    api: str, flow_run_id: str, proc: subprocess.Popen[str], hold: _Hold, *, settle_s: float = 20.0
) -> tuple[str, str]:
    """Cancel the flow run while a request is held, let the CLI see it, then release the
    request; returns the CLI's stdout and stderr.

    The CLI reads the state once a second, and its SIGTERM interrupts a held request, so
    the wait ends when the CLI does (at most ``settle_s`` seconds: a fixed 2.5 s lost the
    race on a loaded machine, the cancel then landing after the request went on). Where the
    CLI holds the signal (after its commit) it cannot end before the release: pass a short
    ``settle_s`` there."""
    _cancel(api, flow_run_id)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=settle_s)
    hold.release.set()
    return proc.communicate(timeout=60)


class _Hold:
    """A ``ResettingProxy`` fault that only delays: the first ``method`` request whose path
    holds ``marker`` waits until ``release`` is set (at most 60 s), then is forwarded."""

    def __init__(self, method: str, marker: str) -> None:
        self.method, self.marker = method, marker
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, method: str, path: str) -> None:
        if method == self.method and self.marker in path and not self.reached.is_set():
            self.reached.set()
            self.release.wait(60)


@pytest.mark.parametrize("moment", ["before-dispatch", "sink-load", "after-commit"])
def test_a_cancel_before_dispatch_or_after_the_commit_ends_as_a_sigterm_there_does(
    prefect_api_url: str,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
    tmp_path: Path,
    moment: str,
) -> None:
    """Held in the run lease's PUT (the flow's last request before any chunk is dispatched;
    the conditional-write probe is sent by the CLI before Prefect starts, when no flow run
    exists to cancel): one line, 143, nothing sent, the run ``interrupted`` and the flow
    run Cancelled. Held in
    the run lease's DELETE (after the commit, only reporting left): the cancel is held like
    a signal, the summary prints, then one line saying the run is committed, 143; the flow
    run ends Completed (it stopped nothing), after the Cancelling the cancel asked for. Held
    in the ``--sink`` load's read of a chunk (after the commit, the load left): one line
    saying a rerun loads it, 143, Cancelled."""
    api, ledger = prefect_api_url, tmp_path / "ledger.sqlite3"
    _write_csv(tmp_path, rows=8)
    args = _run_args(fake_openai, f"s3://{s3_bucket}/out", ledger)
    hold: Any = {
        "before-dispatch": _Hold("PUT", "_embedline/runs/"),
        "sink-load": _Hold("GET", "/chunks/"),
        "after-commit": _Hold("DELETE", "_embedline/runs/"),
    }[moment]
    if moment == "sink-load":
        args += ["--sink", f"lancedb://{tmp_path / 'lance'}"]
    with ResettingProxy(moto_endpoint, fault=hold) as proxy:
        proc = _cli(*args, cwd=tmp_path, env={"AWS_ENDPOINT_URL": proxy.url})
        with _ended(proc, hold):
            flow_run_id = _find_flow_run(api, ledger, proc)
            assert hold.reached.wait(120), "the flow never reached the held request"
            out, err = _cancel_then_release(
                api, flow_run_id, proc, hold, settle_s=6.0 if moment == "after-commit" else 20.0
            )
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "UnfinishedRun" not in err, err[-3000:]
    final = _final_state(api, flow_run_id)
    status = _status(tmp_path, ledger)
    if moment == "before-dispatch":
        line = "embedline: cancelled from Prefect; rerun the same command to resume"
        assert _embedline_lines(err) == [line], err[-3000:]
        assert out == ""
        assert fake_openai.counters()["requests"] == 0
        assert final["state_type"] == "CANCELLED", final["state"]
        assert "\tinterrupted\t" in status, status
    elif moment == "sink-load":
        [line] = _embedline_lines(err)
        assert line.startswith("embedline: cancelled from Prefect after run "), err[-3000:]
        assert line.endswith(".json): rerun the same command to load it into the sink"), line
        assert final["state_type"] == "CANCELLED", final["state"]
        assert "\tcomplete\t" in status, status  # committed; the load is what is left
    else:
        [line] = _embedline_lines(err)
        assert line.startswith("embedline: cancelled from Prefect after run "), err[-3000:]
        assert line.endswith(".json): nothing to resume"), line
        assert "status     complete" in out, out
        assert final["state_type"] == "COMPLETED", final["state"]
        assert _history(api, flow_run_id)[-3:] == ["CANCELLING", "RUNNING", "COMPLETED"]
        assert "\tcomplete\t" in status, status


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_embedline_load_cancelled_from_prefect_ends_cancelled_and_a_rerun_loads(
    prefect_api_url: str,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    """The ``load-run`` flow that ``embedline load`` runs, cancelled while a chunk is being
    loaded (its read from the store held): one line, 143, the flow run Cancelled; the next
    load finishes it."""
    api, ledger, output = prefect_api_url, tmp_path / "ledger.sqlite3", f"s3://{s3_bucket}/out"
    _write_csv(tmp_path, rows=8)
    run = _run_args(fake_openai, output, ledger)
    embedded = run_cli_process(
        [sys.executable, "-m", "cli", *run],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL": moto_endpoint},
    )
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    load = [
        "load",
        "--to",
        f"lancedb://{tmp_path / 'lance'}",
        "--output",
        output,
        "--ledger",
        str(ledger),
    ]
    hold = _Hold("GET", "/chunks/")
    with ResettingProxy(moto_endpoint, fault=hold) as proxy:
        proc = _cli(*load, cwd=tmp_path, env={"AWS_ENDPOINT_URL": proxy.url})
        with _ended(proc, hold):
            assert hold.reached.wait(120), "no chunk was read"
            [flow_run] = [
                r
                for r in httpx.post(
                    f"{api}/flow_runs/filter",
                    timeout=10,
                    json={
                        "flows": {"name": {"any_": ["load-run"]}},
                        "flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}},
                    },
                ).json()
                if r["parameters"].get("ledger") == str(ledger)
            ]
            _out, err = _cancel_then_release(api, flow_run["id"], proc, hold)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert _embedline_lines(err) == [
        "embedline: cancelled from Prefect; rerun the same command to resume"
    ], err[-3000:]
    assert _final_state(api, flow_run["id"])["state_type"] == "CANCELLED"
    again = run_cli_process(
        [sys.executable, "-m", "cli", *load],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL": moto_endpoint},
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "load       loaded" in again.stdout, again.stdout
