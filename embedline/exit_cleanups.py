"""Cleanups that must run however the process ends: at interpreter exit (``atexit``) and when
the CLI ends its process with ``os._exit`` (``run_exit_cleanups``), e.g. removing a run's
scratch directory or closing its ledger."""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Callable

__all__ = ["exit_cleanup", "run_exit_cleanups"]

#: ``exit_cleanup`` functions, in the order registered.
_exit_cleanups: list[Callable[[], None]] = []


def exit_cleanup(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Register ``cleanup`` (no arguments; safe to call twice) to run at interpreter exit,
    as ``atexit.register`` does, and also from ``run_exit_cleanups``: the CLI may end its
    process with ``os._exit`` before ``atexit`` runs (``cli.entry``: after stopping its
    temporary server, Prefect's senders would otherwise retry for seconds), and a run's
    scratch directory must not stay behind after an interrupt. Usable as a decorator."""
    _exit_cleanups.append(cleanup)
    atexit.register(cleanup)
    return cleanup


def run_exit_cleanups() -> None:
    """Run every ``exit_cleanup``, the last registered first (as ``atexit`` would); one
    that fails does not stop the others (the process is ending)."""
    for cleanup in reversed(_exit_cleanups):
        with contextlib.suppress(Exception):
            cleanup()
