"""Finding the ledger and a run in it for the read commands, with one line and exit 2 when
there is none."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from cli.arguments import DEFAULT_LEDGER
from cli.failures import EXIT_USAGE, fail

if TYPE_CHECKING:
    from adapters.ledger import Ledger

__all__ = ["check_ledger_dir", "find_run", "open_ledger"]


def open_ledger(path: str) -> Ledger:
    """Open the ledger at ``path``; exit 2 with one line if there is none."""
    from adapters.ledger import Ledger

    if not os.path.exists(path):
        raise SystemExit(fail(
            f"embedline: error: no ledger at {os.path.abspath(path)}: `embedline run` keeps "
            f"it in {DEFAULT_LEDGER} under the directory it ran in; cd there or pass "
            "--ledger PATH", EXIT_USAGE))
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
    starts; they were a traceback from the flow's first scratch directory.

    :raises InputError: (exit 2) the directory cannot be created.
    """
    from embedline.errors import InputError

    try:
        os.makedirs(os.path.dirname(os.path.abspath(ledger)), exist_ok=True)
    except OSError as exc:
        why = ("a file stands where a directory should be"
               if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror)
        raise InputError(f"cannot use the ledger {ledger}: {why} ({exc.filename}); pass "
                         "--ledger a path in a directory you can write") from None
