"""Imported by each worker of the CLI's local Dask cluster as it starts
(``distributed.worker.preload``; Dask docs, "Customize initialization").

When the flow stops (a Ctrl-C while the cluster starts or runs), the scheduler in the CLI's
process closes before its workers; a worker then logs "Failed to communicate with scheduler
during heartbeat." at ERROR with a 40-line ``CommClosedError`` traceback, after the CLI's
one-line message. Records whose exception is the scheduler's connection closing are dropped
here, unless ``--debug``: the CLI reports how the run ended itself. Any other worker warning
or error (memory, a task's crash) is kept.
"""

from __future__ import annotations

import logging
import os

from adapters.memory import keep_memory_flat
from embedline.tracebacks import DEBUG_ENV

#: Exceptions a worker gets when its scheduler's connection closes (distributed.comm.core,
#: tornado.iostream), matched by name: this module must not import distributed's internals.
_CLOSED = frozenset({"CommClosedError", "StreamClosedError"})


class SchedulerGoneFilter(logging.Filter):
    """Drop a record whose exception, or one it was raised from or during, is a closed
    connection (``_CLOSED``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        seen = 0
        while exc is not None and seen < 10:
            if type(exc).__name__ in _CLOSED:
                return False
            exc, seen = exc.__cause__ or exc.__context__, seen + 1
        return True


def _install() -> None:
    if os.environ.get(DEBUG_ENV):
        return
    logger = logging.getLogger("distributed")
    for handler in logger.handlers:  # distributed's own stderr handler: every distributed.*
        handler.addFilter(SchedulerGoneFilter())


_install()
keep_memory_flat()  # the workers' chunk threads fragment malloc arenas like the CLI's
