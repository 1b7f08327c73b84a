"""The manifest's PUT is a run's commit point (docs/reference/output-layout.md); the ledger records
it a few milliseconds later. A signal or a kill in between must not leave the ledger disagreeing
with the store: a run whose manifest exists reads ``complete``, with the manifest's counts.

The window is hit every time by a test-only ``sitecustomize`` (``tests/support/signal_at``)
that has the process signal itself right after the manifest's PUT returns. Before: 4 in 10
real signals sent just after "manifest committed" left the run ``interrupted`` for good,
its dead letters uncounted, and ``load --ledger`` then found "no committed run".
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from pathlib import Path

import pytest

from tests.support.csv_data import write_rows
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli

pytestmark = pytest.mark.integration

SIGNAL_AFTER_MANIFEST_PUT = "after:tasks.commit.commit_run:write_manifest:{}"


def _rows() -> list[tuple[str, str]]:
    rows = [(f"r{i:02d}", f"text {i}") for i in range(12)]
    rows[5] = ("r05", "")  # a dead letter: the manifest counts it, so must the ledger
    return rows


def _run(
    tmp_path: Path, server: FakeEmbeddingServer, *extra: str, signals: str = ""
) -> tuple[int, str, str]:
    env = {
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests/support/signal_at"), str(REPO)]),
        "EMBEDLINE_TEST_SIGNALS": signals,
    }
    done = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        "out",
        "--ledger",
        "ledger.sqlite3",
        "--chunk-size",
        "4",
        "--allow-failed-rows",
        *extra,
        cwd=tmp_path,
        env=env,
    )
    return done.returncode, done.stdout, done.stderr


def _ledger_run(tmp_path: Path) -> tuple[str, str, int, int, str | None]:
    """The newest run: (run key, status, rows published, rows failed, manifest URI)."""
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        return db.execute(
            "SELECT run_key, status, rows_published, rows_failed, manifest_uri "
            "FROM runs ORDER BY created_at DESC"
        ).fetchone()


def _assert_ledger_matches_the_store(tmp_path: Path) -> None:
    run_key, status, published, failed, uri = _ledger_run(tmp_path)
    manifest = json.loads((tmp_path / "out/manifests" / f"{run_key}.json").read_text())
    assert (manifest["rows_published"], manifest["rows_failed"]) == (11, 1)
    assert (status, published, failed) == ("complete", 11, 1)
    assert uri is not None and uri.endswith(f"manifests/{run_key}.json")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_just_after_the_manifest_put_leaves_the_run_complete_in_the_ledger(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, signum: signal.Signals
) -> None:
    """The interrupt waits until the ledger has recorded the commit, then stops the command
    (130/143) with one line that says the run is committed: nothing to redo. Before, the
    line asked to rerun, and a rerun had nothing to do."""
    write_rows(tmp_path / "in.csv", _rows())
    code, _, err = _run(
        tmp_path, fake_openai, signals=SIGNAL_AFTER_MANIFEST_PUT.format(signum.name)
    )
    assert code == 128 + signum, err[-3000:]
    _assert_ledger_matches_the_store(tmp_path)
    run_key, *_, manifest_uri = _ledger_run(tmp_path)
    assert err.strip().splitlines()[-1] == (
        f"embedline: interrupted by {signum.name} after run {run_key[:12]} was committed "
        f"({manifest_uri}): nothing to resume"
    ), err[-3000:]
    requests = fake_openai.counters()["requests"]
    code, out, err = _run(tmp_path, fake_openai)
    assert code == 0 and "as committed earlier" in out, err[-3000:]
    assert fake_openai.counters()["requests"] == requests


@pytest.mark.parametrize("path", ["flow", "no-prefect"])
def test_a_kill_just_after_the_manifest_put_is_caught_up_by_the_rerun(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, path: str
) -> None:
    """SIGKILL cannot be deferred: the ledger still says ``running``. The rerun finds the
    manifest, answers "nothing to do", and the ledger then agrees with the store.

    ``flow``: the run that embeds commits inside the Prefect flow. ``no-prefect``: a
    re-export of the same rows (CRLF line ends), whose chunks are all published, is
    committed by the CLI without starting Prefect."""
    rows = _rows()
    write_rows(tmp_path / "in.csv", rows)
    signals = SIGNAL_AFTER_MANIFEST_PUT.format("SIGKILL")
    if path == "no-prefect":
        assert _run(tmp_path, fake_openai)[0] == 0
        crlf = (tmp_path / "in.csv").read_bytes().replace(b"\n", b"\r\n")
        (tmp_path / "in.csv").write_bytes(crlf)
    code, _, err = _run(tmp_path, fake_openai, signals=signals)
    assert code == -signal.SIGKILL, err[-3000:]
    assert _ledger_run(tmp_path)[1] == "running"  # what the kill left: the store has the commit
    requests = fake_openai.counters()["requests"]
    code, out, err = _run(tmp_path, fake_openai)
    assert code == 0 and "as committed earlier" in out, err[-3000:]
    assert fake_openai.counters()["requests"] == requests
    _assert_ledger_matches_the_store(tmp_path)
    status = run_cli("status", "--ledger", "ledger.sqlite3", cwd=tmp_path)
    assert status.returncode == 0 and status.stdout.splitlines()[0].split()[1] == "complete", (
        status.stdout
    )


@pytest.mark.parametrize(
    ("point", "signum", "sink"),
    [
        (
            "after:tasks.commit.commit_run:write_manifest",
            signal.SIGINT,
            False,
        ),  # in the commit's deferral
        ("before:tasks.lease.held:drop_lease", signal.SIGTERM, False),  # after it: the last steps
        ("before:tasks.lease.held:drop_lease", signal.SIGINT, False),
        ("before:tasks.lease.held:drop_lease", signal.SIGINT, True),  # after the sink's load
    ],
    ids=["SIGINT-at-commit", "SIGTERM-after-commit", "SIGINT-after-commit", "SIGINT-after-load"],
)
def test_a_signal_after_the_commit_leaves_the_flow_run_completed_in_prefect(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    prefect_api_url: str,
    point: str,
    signum: signal.Signals,
    sink: bool,
) -> None:
    """Once the run is committed (and loaded, with ``--sink``), only reporting is left: the
    signal is held until the flow run has ended, so the Prefect UI shows it Completed, as
    the store and the ledger do; then the command prints its summaries and stops with
    130/143 and the committed line. Before, Prefect marked the committed run's flow run
    Crashed ("Execution was interrupted by …")."""
    import httpx

    write_rows(tmp_path / "in.csv", _rows())
    extra = ("--sink", f"lancedb://{tmp_path}/lance?table=t") if sink else ()
    nth = ":2" if sink else ""  # with --sink, the load's lease is released first
    code, out, err = _run(tmp_path, fake_openai, *extra, signals=f"{point}:{signum.name}{nth}")
    assert code == 128 + signum, err[-3000:]
    if sink:
        assert "rows       11 upserted now" in out, out
    _assert_ledger_matches_the_store(tmp_path)
    run_key, *_, manifest_uri = _ledger_run(tmp_path)
    assert err.strip().splitlines()[-1] == (
        f"embedline: interrupted by {signum.name} after run {run_key[:12]} was committed "
        f"({manifest_uri}): nothing to resume"
    ), err[-3000:]
    flow_run_id = re.search(r"flow-run/([0-9a-f-]{36})", err)
    assert flow_run_id, err[-3000:]
    flow_run = httpx.get(f"{prefect_api_url}/flow_runs/{flow_run_id.group(1)}").json()
    assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]
