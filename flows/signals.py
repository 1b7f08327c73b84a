"""Graceful stop on SIGINT/SIGTERM while chunks are in flight.

First signal: submit no more chunks and give in-flight chunks ``grace_s`` seconds to finish
(their requests are paid for: let them land); chunks still running then stop before their
next request and are released in the ledger; the run exits 130 (SIGINT) or 143 (SIGTERM).
Second signal: exit at once with the same code (``shutdown.hard_exit``, whose hook from
``adapters.ledger.record_hard_stop`` marks the run ``interrupted``); the ledger stays consistent because
every write is one SQLite transaction, and chunks left ``running`` are reclaimed by the next
run on this host as soon as it sees their process is gone.

Prefect 3.9 installs its own SIGTERM handler for the flow run (it raises
``TerminationSignal`` and marks the run Crashed); this context replaces it only while chunks
are dispatched and restores it afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

from embedline import shutdown
from flows.dispatch import Dispatcher

__all__ = ["stop_on_signals"]


@contextlib.contextmanager
def stop_on_signals(
    dispatcher: Dispatcher, *, grace_s: float, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> Iterator[None]:
    """Install SIGINT/SIGTERM handlers for the block (main thread only; else a no-op). A
    signal this process inherited as ignored (SIG_IGN: a background job of a
    non-interactive shell, ``nohup``) stays ignored, as Python itself does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: object) -> None:
        if shutdown.stop_signal() is not None:
            shutdown.exit_on_second_signal(signum)
        shutdown.note_signal(signum)
        dispatcher.stop(grace_s=grace_s)
        logger.warning(
            "%s received: no new chunks; in-flight chunks get %g s to finish, then are "
            "released (send it again to exit now)", signal.Signals(signum).name, grace_s,
        )  # fmt: skip

    previous = {s: signal.signal(s, handle) for s in shutdown.SIGNALS
                if signal.getsignal(s) is not signal.SIG_IGN}  # an inherited SIG_IGN is kept
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
