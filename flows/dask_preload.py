"""Imported by each worker of the CLI's local Dask cluster as it starts
(``distributed.worker.preload``; Dask docs, "Customize initialization").

When the flow stops (a Ctrl-C while the cluster starts or runs), the scheduler in the CLI's
process closes before its workers; a worker then logs "Failed to communicate with scheduler
during heartbeat." at ERROR with a 40-line ``CommClosedError`` traceback, after the CLI's
one-line message. Records whose exception is the scheduler's connection closing are dropped
here (``flows.dask_logging``), unless ``--debug``: the CLI reports how the run ended
itself. Any other worker warning or error (memory, a task's crash) is kept. A worker ignores
SIGINT (a terminal's Ctrl-C): the CLI stops it.

Importing the module changes nothing: Dask calls ``dask_setup(worker)`` once the worker
starts (the preload protocol), so a process that imports it to read it (a test, a linter)
keeps its own signal handlers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

from adapters.memory import keep_memory_flat
from embedline.tracebacks import DEBUG_ENV
from flows.dask_logging import SchedulerGoneFilter


def _ignore_terminal_interrupts() -> None:
    """A terminal's Ctrl-C goes to its whole foreground process group, and the local
    cluster's workers are in the CLI's: each got the SIGINT itself and cancelled its chunk
    tasks at once (what they had paid for lost, KeyboardInterrupt tracebacks printed) while
    the CLI was giving in-flight chunks ``--grace`` seconds. The CLI stops its workers itself
    (closing the cluster), so a worker ignores SIGINT."""
    with contextlib.suppress(ValueError):  # not the main thread: nothing to change there
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _install() -> None:
    if os.environ.get(DEBUG_ENV):
        return
    logger = logging.getLogger("distributed")
    for handler in logger.handlers:  # distributed's own stderr handler: every distributed.*
        handler.addFilter(SchedulerGoneFilter())


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, called in the worker's process as ``worker`` (a
    ``distributed.Worker``) starts."""
    _ignore_terminal_interrupts()
    _install()
    keep_memory_flat()  # the workers' chunk threads fragment malloc arenas like the CLI's
