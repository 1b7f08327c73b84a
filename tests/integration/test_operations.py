"""Operating the deployments as a service, on a real Prefect server and process worker:
the alerts of deployments/automations.yaml reach a webhook served on loopback (a failed
nightly run, a late one, a commit with dead letters), a commit's ``embedline.run.committed``
event starts the load-after-commit deployment with the run's key, and ``status --json``
agrees with the ledger. One nightly run fails, one commits: both alerts and the trigger are
checked on the same two runs (CI time)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.test_deployment import POOL, _fake_api, _prefect, _wait_terminal
from tests.support.fixtures import REPO
from tests.support.forked_cli import run_cli_process
from tests.support.loopback_http import LoopbackRecorder
from tests.support.prefect_server import (
    param_arguments,
    start_prefect_worker,
    stop_prefect_worker,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def webhook() -> Iterator[LoopbackRecorder]:
    """A webhook on loopback recording each JSON body it is posted."""
    with LoopbackRecorder() as server:
        yield server


@pytest.fixture
def fake_api() -> Iterator[tuple[str, str]]:
    yield from _fake_api()


def _wait_for(what: str, found: Any, timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(
        f"{what} did not happen within {timeout} s; worker log:\n"
        f"{log.read_text(errors='replace')[-3000:]}"
    )


def _texts(hooks: LoopbackRecorder, needle: str) -> list[str]:
    return [m["text"] for m in hooks.json_bodies() if needle in m["text"]]


def _run_deployment(name: str, params: dict[str, Any]) -> str:
    args = param_arguments(params)
    started = _prefect("deployment", "run", name, *args)
    match = re.search(r"UUID: ([0-9a-f-]{36})", started)
    assert match, started
    return match.group(1)


def _automation(api: str, name: str) -> list[dict[str, Any]]:
    found = httpx.post(f"{api}/automations/filter", timeout=10, json={}).json()
    return [a for a in found if a["name"] == name]


def test_alerts_events_and_status_json_on_a_real_server(
    prefect_api_url: str,
    webhook: LoopbackRecorder,
    fake_api: tuple[str, str],
    tmp_path: Path,
) -> None:
    api, (base_url, _control) = prefect_api_url, fake_api
    _prefect("work-pool", "create", POOL, "--type", "process", "--overwrite")
    _prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")

    # ── the alerts, with a 10 s "late" window and any dead letter alerting ─────────────────
    config = yaml.safe_load((REPO / "deployments" / "automations.yaml").read_text())
    config.update(success_every="10s", grace="0s", dead_letters_threshold=0)
    (tmp_path / "automations.yaml").write_text(yaml.safe_dump(config))
    hook_url = f"{webhook.url}/hook"
    for _ in range(2):  # applying twice replaces: one automation of each name
        applied = subprocess.run(
            [
                sys.executable,
                "deployments/automations.py",
                "--file",
                str(tmp_path / "automations.yaml"),
                "--webhook-url",
                hook_url,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("automation applied:") == 3
    assert hook_url not in applied.stdout + applied.stderr  # it may hold a token
    for spec in config["automations"]:
        assert len(_automation(api, spec["name"])) == 1, spec["name"]
    # a notification block that is not there: LookupError naming it (the script's one line)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.automations import apply

    with (
        temporary_settings(updates={PREFECT_API_URL: api}),
        pytest.raises(LookupError, match="no notification block 'custom-webhook/nowhere'"),
    ):
        apply(dict(config, notify_block="custom-webhook/nowhere"))

    # ── the commit event starts load-after-commit: switch its trigger on, point it here ───
    (trigger,) = _automation(api, "load-after-commit__automation_1")
    httpx.patch(
        f"{api}/automations/{trigger['id']}", json={"enabled": True}, timeout=10
    ).raise_for_status()
    out, ledger = tmp_path / "out", tmp_path / "ledger.sqlite3"
    sink = f"lancedb://{tmp_path / 'lancedb'}?table=documents"
    loader = httpx.get(f"{api}/deployments/name/load-run/load-after-commit", timeout=10).json()
    httpx.patch(
        f"{api}/deployments/{loader['id']}",
        timeout=10,
        json={"parameters": {"to": sink, "output": str(out), "ledger": str(ledger)}},
    ).raise_for_status()

    log = tmp_path / "worker.log"
    worker = start_prefect_worker(POOL, log)
    try:
        # ── a failing nightly run (its input is missing) alerts ───────────────────────────
        failing = _run_deployment("embed-csv/nightly", {"input": tmp_path / "missing.csv"})
        assert _wait_terminal(api, failing, log)["state_type"] == "FAILED"
        failed = _wait_for("the Failed alert", lambda: _texts(webhook, "Failed"), 60, log)
        assert "nightly run" in failed[0]
        # ── no Completed nightly run within 10 s: the late alert ──────────────────────────
        late = _wait_for(
            "the late alert", lambda: _texts(webhook, "no successful nightly run"), 60, log
        )
        assert "10s" in late[0]

        # ── a nightly run that commits with one dead letter (an empty text, skipped) ──────
        rows = [(f"p{i}", "" if i == 3 else f"package {i}\nline two") for i in range(12)]
        with (tmp_path / "in.csv").open("w", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerows([("id", "text"), *rows])
        committing = _run_deployment(
            "embed-csv/nightly",
            {
                "input": tmp_path / "in.csv",
                "output": out,
                "ledger": ledger,
                "embedder": "openai",
                "base_url": base_url,
                "chunk_size": 5,
            },
        )
        assert _wait_terminal(api, committing, log)["state_type"] == "COMPLETED"
        dead = _wait_for(
            "the dead-letter alert",
            lambda: _texts(webhook, "committed with 1 dead letters"),
            60,
            log,
        )
        assert "embedline dead-letters RUN" in dead[0]

        # ── status --json: the run's facts, as the ledger holds them ──────────────────────
        status = run_cli_process(
            [sys.executable, "-m", "cli", "status", "--json", "--ledger", str(ledger)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        (facts,) = [json.loads(line) for line in status.stdout.splitlines()]
        assert (facts["status"], facts["rows_published"], facts["dead_letters"]) == (
            "complete",
            11,
            1,
        )
        assert facts["committed"]["rows_added"] == 11 and facts["committed"]["tokens"] > 0
        run_key = facts["run_key"]

        # ── the commit event started load-after-commit with this run's key ────────────────
        def loads() -> list[dict[str, Any]]:
            found = httpx.post(
                f"{api}/flow_runs/filter",
                timeout=10,
                json={"deployments": {"id": {"any_": [loader["id"]]}}},
            ).json()
            return [r for r in found if r["state_type"] == "COMPLETED"]

        (load,) = _wait_for("the triggered load", loads, 90, log)
        assert load["parameters"]["run"] == run_key
        assert load["parameters"]["output"] == str(out)
        import lancedb

        table = lancedb.connect(str(tmp_path / "lancedb")).open_table("documents")
        assert table.count_rows() == 11
    finally:
        stop_prefect_worker(worker)
        httpx.patch(f"{api}/automations/{trigger['id']}", json={"enabled": False}, timeout=10)
        for spec in config["automations"]:
            for automation in _automation(api, spec["name"]):
                httpx.delete(f"{api}/automations/{automation['id']}", timeout=10)
