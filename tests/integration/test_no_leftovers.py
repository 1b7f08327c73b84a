"""What `embedline` leaves beside the user's ledger: the ledger file, nothing else. After a
run, no empty ``scratch/`` directory; after the commands that read the ledger, no SQLite
``-wal`` or ``-shm`` file (the CLI ends with ``os._exit``, which skipped closing the
connection, so SQLite kept them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli
from tests.support.forked_cli import popen_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A committed run of a small file with a ledger in a directory of its own."""
    root = tmp_path_factory.mktemp("leftovers")
    (root / "in.csv").write_text("id,text\n1,hello\n2,\n3,world\n", encoding="utf-8")
    done = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "local",
        "--output",
        "out",
        "--ledger",
        "book/ledger.sqlite3",
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    key = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("run "))
    return root, key


def _beside_the_ledger(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "book").iterdir())


def test_a_run_leaves_only_its_ledger_beside_it(ran: tuple[Path, str]) -> None:
    assert _beside_the_ledger(ran[0]) == ["ledger.sqlite3"]


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "{run}", "--json"],
        ["dead-letters", "{run}"],
        ["gc", "out", "--dry-run"],
        ["search", "out", "hello"],
    ],
)
def test_a_command_that_reads_the_ledger_leaves_no_wal_or_shm_file(
    ran: tuple[Path, str],
    command: list[str],
) -> None:
    root, key = ran
    args = [part.format(run=key) for part in command]
    done = run_cli(*args, "--ledger", "book/ledger.sqlite3", cwd=root)
    assert done.returncode == 0, done.stderr
    assert _beside_the_ledger(root) == ["ledger.sqlite3"], args


def _interrupt_in_reuse_stage(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``embedline ARGS`` and send SIGTERM once its reuse stage has written its files
    (``reuse-*`` in the run's scratch directory: planning is done, the flow has not
    started); return (exit status, stderr)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support.fixtures import REPO

    proc = popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            staged = any((cwd / "book" / "scratch").glob("*/reuse-*"))
        except FileNotFoundError:  # a scratch directory removed while listed: look again
            staged = False
        if staged:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.005)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("night", ["copied night", "night with one change"])
def test_an_interrupted_run_with_the_temporary_server_leaves_only_its_ledger(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
    night: str,
) -> None:
    """With the CLI's temporary server, an interrupted command ends with ``os._exit`` once
    the server is stopped (Prefect's senders would retry for seconds): that skipped
    ``atexit``, and the run's scratch directory (about 3 GB at 10M rows) stayed until the
    next run. Interrupted as its reuse stage ends: a night with a change is then starting
    the server for its flow; a copied night never starts it and must not take that exit."""
    import csv
    import random

    from tests.support.prefect_home import fresh_prefect_home

    monkeypatch.setenv("PREFECT_HOME", str(fresh_prefect_home(tmp_path / "home")))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    rows = [(f"pkg-{i}", f"package {i} does thing {i % 97}") for i in range(20_000)]
    night_rows = random.Random(4).sample(rows, len(rows))
    if night == "night with one change":  # its flow starts the server after the stage
        night_rows[5] = (night_rows[5][0], "a text no earlier run embedded")
    for name, order in (("base.csv", rows), ("night.csv", night_rows)):
        with (tmp_path / name).open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(("id", "text"))
            writer.writerows(order)
    common = [
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--ledger",
        "book/ledger.sqlite3",
        "--chunk-size",
        "200",
    ]
    assert run_cli("run", "base.csv", *common, cwd=tmp_path).returncode == 0
    code, err = _interrupt_in_reuse_stage(["run", "night.csv", *common], tmp_path)
    assert code in (0, 143), err  # 0: the run ended before the signal landed
    assert "Traceback" not in err, err
    assert _beside_the_ledger(tmp_path) == ["ledger.sqlite3"], err
