"""The filter that drops Dask's log records about a scheduler connection that closed: the
workers install it as they start (``flows.dask_preload``), the CLI on its Dask client's
logger (``flows.task_runner``). No side effect on import, unlike ``flows.dask_preload``."""

from __future__ import annotations

import logging

__all__ = ["SchedulerGoneFilter"]

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
