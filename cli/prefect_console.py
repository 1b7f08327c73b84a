"""Prefect's console output around a signal: its own account of an interrupted or
terminated flow run is dropped, since the command's one line says all of it (``--debug``
keeps it)."""

from __future__ import annotations

import os
from typing import Any

from embedline.tracebacks import DEBUG_ENV

__all__ = ["quiet_prefect_console", "quiet_prefect_signal_crashes"]


def quiet_prefect_console() -> None:
    """A first-interrupt hook (``STOP.on_first_interrupt``): an interrupt raised inside a
    flow run before any chunk is dispatched makes Prefect print its own account of it on
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
    ``flows.interrupt_handlers.take_over_sigterm``) SIGTERM goes to Prefect's own handler,
    which reports the crash on the console ("Crash detected! Execution was aborted by a termination
    signal.", "Finished in state Crashed(…)") above the command's one line (most SIGTERMs
    sent 0-30 ms after "Beginning flow run" land there). Prefect's console handlers
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

    loggers = [
        logging.getLogger(),
        *(
            logger
            for logger in logging.root.manager.loggerDict.values()
            if isinstance(logger, logging.Logger)
        ),
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler).__name__ == "PrefectConsoleHandler":
                handler.addFilter(_CONSOLE_GATE)  # a no-op if it is there already
