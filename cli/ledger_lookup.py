"""Finding the ledger and a run in it for the read commands, with one line and exit 2 when
there is none."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from cli.failures import EXIT_USAGE, fail
from cli.run_options import DEFAULT_LEDGER

if TYPE_CHECKING:
    from adapters.ledger import Ledger

__all__ = ["check_ledger", "check_ledger_dir", "find_run", "open_ledger"]


def open_ledger(path: str) -> Ledger:
    """Open the ledger at ``path``; exit 2 with one line if there is none."""
    from adapters.ledger import Ledger

    if not os.path.exists(path):
        raise SystemExit(
            fail(
                f"embedline: error: no ledger at {os.path.abspath(path)}: `embedline run` keeps "
                f"it in {DEFAULT_LEDGER} under the directory it ran in; cd there or pass "
                "--ledger PATH",
                EXIT_USAGE,
            )
        )
    return Ledger(path)


def find_run(ledger: Ledger, key: str) -> Any:
    """The ledger's run for a run key or unique prefix (≥ 8 hex); exit 2 if none or ambiguous."""
    try:
        record = ledger.find_run(key)
    except ValueError as exc:
        raise SystemExit(fail(f"embedline: error: {exc}", EXIT_USAGE)) from None
    if record is None:
        raise SystemExit(fail(f"embedline: error: no run {key!r} in {ledger.path}", EXIT_USAGE))
    return record


def check_ledger_dir(ledger: str) -> None:
    """Create the ledger's directory now (it is also the run's scratch root), so a file in
    the way, a read-only filesystem or missing permissions are one line before anything
    starts, not a traceback from the flow's first scratch directory.

    :raises InputError: (exit 2) the directory cannot be created.
    """
    from embedline.errors import InputError

    try:
        os.makedirs(os.path.dirname(os.path.abspath(ledger)), exist_ok=True)
    except OSError as exc:
        why = (
            "a file stands where a directory should be"
            if isinstance(exc, (FileExistsError, NotADirectoryError))
            else exc.strerror
        )
        raise InputError(
            f"cannot use the ledger {ledger}: {why} ({exc.filename}); pass "
            "--ledger a path in a directory you can write"
        ) from None


def check_ledger(ledger: str) -> None:
    """``check_ledger_dir``, then what a run needs of the ledger beyond its directory: a file
    can be written there (the run's scratch files, SQLite's WAL), and an existing ledger
    opens as one. Unchecked, each would end a flow run in a traceback ("file is not a
    database", "attempt to write a readonly database", "Operation not permitted: …/scratch").

    :raises InputError: (exit 2) one line that names the path and what to do.
    """
    import sqlite3
    import tempfile

    from adapters.disk_full import translate_full
    from adapters.ledger import Ledger
    from embedline.errors import InputError

    check_ledger_dir(ledger)
    directory = os.path.dirname(os.path.abspath(ledger))
    try:
        with (
            translate_full(ledger, "ledger"),
            tempfile.TemporaryFile(dir=directory, prefix=".embedline-probe-"),
        ):
            pass
    except OSError as exc:  # a full filesystem is DiskFullError (exit 1), raised as is
        raise InputError(
            f"cannot write in the ledger's directory {directory} "
            f"({exc.strerror}): pass --ledger a path in a directory you can "
            "write"
        ) from None
    if not os.path.exists(ledger):
        return
    try:
        Ledger(ledger).close()
    except (sqlite3.Error, OSError) as exc:
        raise InputError(
            f"cannot use the ledger {ledger} ({exc}): fix its permissions or restore it from "
            "a backup, or move it away and rerun: a new ledger finds what the output already "
            "holds (nothing published is sent again)"
        ) from None
