"""Helpers every command shares: argument types, one-line failures, opening the ledger."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from embedline.tracebacks import DEBUG_ENV

__all__ = ["DEFAULT_LEDGER", "EXIT_FATAL", "EXIT_USAGE", "HELP_FORMATTER", "LEDGER_HELP",
           "MAX_DELETE_HELP", "exit_on_api_loss", "fail", "find_run", "fraction",
           "non_negative_float", "open_ledger",
           "positive_float", "positive_int", "quiet_prefect_console",
           "quiet_prefect_signal_crashes",
           "with_prefect_api"]  # fmt: skip

EXIT_USAGE = 2
EXIT_FATAL = 3
DEFAULT_LEDGER = ".embedline/ledger.sqlite3"
LEDGER_HELP = ("the SQLite ledger; a relative path is relative to the current directory, so "
               "run `status`, `dead-letters` and `retry-failed` where `run` ran, or pass the "
               "same --ledger")
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default ("(default: 1000)"). An option whose
    default is None (unset) says in its own words what unset means ("(default: no limit)"):
    argparse's "(default: None)" said nothing, or the opposite of the text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


HELP_FORMATTER = HelpFormatter


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float ≥ 0."""
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text}")
    return value


def fraction(text: str) -> float:
    """argparse type: a share from 0 to 1 (``--max-delete-fraction``)."""
    value = float(text)
    if not (0 <= value <= 1):
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text}")
    return value


MAX_DELETE_HELP = ("stop, before deleting anything, a load that would delete more than this "
                   "share of the rows the sink holds, or a commit whose change set removes more "
                   "than this share of the previous run's rows (a cut-short export); exit 2 "
                   "with the counts. 1 allows any delete")


def fail(message: str, code: int) -> int:
    """Print ``message`` (one line) to stderr and return ``code``."""
    print(message, file=sys.stderr)
    return code


def open_ledger(path: str) -> Any:
    """Open the ledger at ``path``; exit 2 with one line if there is none."""
    from adapters.ledger import Ledger

    if not os.path.exists(path):
        raise SystemExit(fail(
            f"embedline: error: no ledger at {os.path.abspath(path)}: `embedline run` keeps "
            f"it in {DEFAULT_LEDGER} under the directory it ran in; cd there or pass "
            "--ledger PATH", EXIT_USAGE))  # fmt: skip
    return Ledger(path)


def find_run(ledger: Any, key: str) -> Any:
    """The ledger's run for a run key or unique prefix (≥ 8 hex); exit 2 if none or ambiguous."""
    try:
        record = ledger.find_run(key)
    except ValueError as exc:
        raise SystemExit(fail(f"embedline: error: {exc}", EXIT_USAGE)) from None
    if record is None:
        raise SystemExit(fail(f"embedline: error: no run {key!r} in {ledger.path}", EXIT_USAGE))
    return record


def with_prefect_api(
    body: Callable[[Any], int], *, on_lost: Callable[[Any], None] | None = None
) -> int:
    """Pick the Prefect API (a temporary server starts now, in the background), call
    ``body(api)`` and stop that server however ``body`` ends, a hard exit included.
    Returns ``body``'s exit code, or 2 with one line when no API is usable.

    If the API goes away while ``body`` runs, ``on_lost(loss)`` is called in a watchdog
    thread (an ``embedline.shutdown.ApiLoss``); by default it prints one line and exits 1.
    """
    from cli.prefect_env import PrefectApiError, prefect_api
    from embedline.shutdown import STOP

    try:
        api = prefect_api()
    except PrefectApiError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    STOP.on_hard_exit(api.kill)
    STOP.on_first_interrupt(quiet_prefect_console)
    api.watch(on_lost or exit_on_api_loss)
    try:
        return body(api)
    finally:
        api.close()


def quiet_prefect_console() -> None:
    """A first-interrupt hook (``STOP.on_first_interrupt``): an interrupt raised inside a
    flow run before any chunk was dispatched made Prefect print its own account of it on
    stderr ("Crash detected! Execution was aborted by an interrupt signal.", "Finished in
    state Crashed(…)", "EventsWorker - Still processing items") above the command's one
    line, which says all of it. Prefect's console handlers drop every record from then on;
    its API handler still sends them (the UI shows the crash). ``--debug`` keeps them."""
    if not os.environ.get(DEBUG_ENV):
        _CONSOLE_GATE.closed = True
        _gate_prefect_console()


def quiet_prefect_signal_crashes() -> None:
    """Call once Prefect is imported (its logging configured), before a flow runs. For the
    first milliseconds of a flow run (until the flow's body calls
    ``STOP.take_over_sigterm``) SIGTERM goes to Prefect's own handler, which reports
    the crash on the console ("Crash detected! Execution was aborted by a termination
    signal.", "Finished in state Crashed(…)") above the command's one line (6 of 7 SIGTERMs
    sent 0-30 ms after "Beginning flow run" in a break test). Prefect's console handlers
    drop such a record and everything after it; its API handler still sends them.
    ``--debug`` keeps them."""
    if not os.environ.get(DEBUG_ENV):
        _gate_prefect_console()


class _ConsoleGate:
    """A logging filter on Prefect's console handlers that, once closed, drops every record:
    closed by the command's first interrupt, or by Prefect's own report of a flow run
    aborted by a signal (what follows is Prefect's teardown of that crash)."""

    MARKERS = ("aborted by a termination signal", "aborted by an interrupt signal")

    def __init__(self) -> None:
        self.closed = False

    def filter(self, record: Any) -> bool:
        """True to print ``record``."""
        if not self.closed:
            message = record.getMessage()
            self.closed = any(marker in message for marker in self.MARKERS)
        return not self.closed


_CONSOLE_GATE = _ConsoleGate()


def _gate_prefect_console() -> None:
    """Put ``_CONSOLE_GATE`` on every Prefect console handler (once each)."""
    import logging

    loggers = [logging.getLogger(), *(logger for logger in logging.root.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]  # fmt: skip
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler).__name__ == "PrefectConsoleHandler":
                handler.addFilter(_CONSOLE_GATE)  # a no-op if it is there already


def exit_on_api_loss(loss: Any, *, kept: str = "what was published is kept",
                     todo: str | None = None) -> None:  # fmt: skip
    """Print one line for an ``embedline.shutdown.ApiLoss`` and exit 1 at once (the hard-exit
    hooks run first: the temporary server is stopped, a started run marked ``interrupted``).
    ``todo`` replaces the loss's own advice (what a rerun does)."""
    from embedline.shutdown import STOP

    sys.stderr.write(f"embedline: error: {loss.what}; {kept}: {todo or loss.todo}\n")
    STOP.hard_exit(1)
