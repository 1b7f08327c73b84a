"""What `embedline` leaves beside the user's ledger: the ledger file, nothing else. After a
run, no empty ``scratch/`` directory; after the commands that read the ledger, no SQLite
``-wal`` or ``-shm`` file (the CLI ends with ``os._exit``, which skipped closing the
connection, so SQLite kept them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fixtures import run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A committed run of a small file with a ledger in a directory of its own."""
    root = tmp_path_factory.mktemp("leftovers")
    (root / "in.csv").write_text("id,text\n1,hello\n2,\n3,world\n", encoding="utf-8")
    done = run_cli("run", "in.csv", "--embedder", "local", "--output", "out", "--ledger",
                   "book/ledger.sqlite3", cwd=root)
    assert done.returncode == 0, done.stderr
    key = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("run "))
    return root, key


def _beside_the_ledger(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "book").iterdir())


def test_a_run_leaves_only_its_ledger_beside_it(ran: tuple[Path, str]) -> None:
    assert _beside_the_ledger(ran[0]) == ["ledger.sqlite3"]


@pytest.mark.parametrize("command", [
    ["status"], ["status", "{run}", "--json"], ["dead-letters", "{run}"],
    ["gc", "out", "--dry-run"], ["search", "out", "hello"],
])
def test_a_command_that_reads_the_ledger_leaves_no_wal_or_shm_file(
    ran: tuple[Path, str], command: list[str],
) -> None:
    root, key = ran
    args = [part.format(run=key) for part in command]
    done = run_cli(*args, "--ledger", "book/ledger.sqlite3", cwd=root)
    assert done.returncode == 0, done.stderr
    assert _beside_the_ledger(root) == ["ledger.sqlite3"], args
