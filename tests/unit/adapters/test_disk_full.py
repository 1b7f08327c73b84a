"""Issue 22 item 9: every write meets a full filesystem as one ``DiskFullError`` naming the
path (exit 1), on a real 2 MiB tmpfs: the SQLite ledger (open, migration, writes) and the
local output store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from adapters.ledger import Ledger
from adapters.object_store import LocalDirStore
from embedline.errors import DiskFullError
from tests.support.tmpfs import fill
from tests.unit.adapters.test_ledger import _plan, _start


def _is_the_one_line(exc: DiskFullError, path: Path, mount: Path) -> None:
    message = str(exc)
    assert "\n" not in message and exc.exit_code == 1
    assert f"{path} is full: free space on {mount} and rerun the same command" in message


def test_a_full_ledger_filesystem_mid_run_is_one_error_and_the_ledger_survives(
    tiny_tmpfs: Path,
) -> None:
    path = tiny_tmpfs / "ledger.sqlite3"
    ledger = Ledger(path)
    run = _start(ledger, _plan(4))
    assert ledger.claim(run, 0, owner="o", lease_s=60)
    filler = fill(tiny_tmpfs)
    with pytest.raises(DiskFullError) as caught:
        for i in range(1, 4):  # the WAL grows with every write until it cannot
            _start(ledger, _plan(200, rows=1), run=f"{i:064x}")
    _is_the_one_line(caught.value, path, tiny_tmpfs)
    ledger.close()
    filler.unlink()
    reopened = Ledger(path)  # what was committed before the disk filled is still there
    assert reopened.chunk_states(run)[0].state == "running"
    reopened.close()


def test_a_ledger_created_on_a_full_filesystem_is_one_error(tiny_tmpfs: Path) -> None:
    fill(tiny_tmpfs)
    path = tiny_tmpfs / "new" / "ledger.sqlite3"
    with pytest.raises(DiskFullError) as caught:
        Ledger(path)
    _is_the_one_line(caught.value, path, tiny_tmpfs)


def test_a_full_output_filesystem_is_one_error_naming_the_object(tiny_tmpfs: Path) -> None:
    store = LocalDirStore(tiny_tmpfs / "out")
    store.prepare()
    fill(tiny_tmpfs)
    body = b"x" * 300_000
    with pytest.raises(DiskFullError) as caught:
        store.put_if_absent(
            "chunks/a.parquet",
            body,
            sha256=hashlib.sha256(body).hexdigest(),
            content_type="application/octet-stream",
        )
    _is_the_one_line(caught.value, tiny_tmpfs / "out" / "chunks" / "a.parquet", tiny_tmpfs)
    assert [p.name for p in (tiny_tmpfs / "out").rglob("*") if p.is_file()] == []  # no temp left
