"""Tracebacks only where they help: an expected failure (an ``EmbedlineError``: a refused
request, a store error, bad input) is logged as its one-line message; anything else keeps
its traceback. ``EMBEDLINE_DEBUG=1`` (``embedline run --debug``) or a logger at DEBUG level
keeps every traceback.

Prefect's task engine logs a failed task run at ERROR with ``exc_info``; for an expected
error that put about 40 lines per failed chunk on the terminal and in the UI's logs.

One line per failed chunk: the flow's dispatcher logs every chunk that did not publish
("chunk N failed: …", "chunk N released …", with the traceback of an unexpected error), so
Prefect's own ERROR lines for an ``embed-chunk`` task run, which repeated it word for word,
are dropped (``ChunkFinalStateFilter``): ``Finished in state Failed(…)`` (Prefect 3.9
``task_engine.py`` logs it for every state that is not Completed) and ``Task run failed
with exception: … - Retries are exhausted``. Its INFO line for a retry it schedules stays,
and the task run's state in the UI still carries the message.
"""

from __future__ import annotations

import logging
import os

from embedline.errors import EmbedlineError

__all__ = ["DEBUG_ENV", "ChunkFinalStateFilter", "ExpectedErrorFilter", "quiet_expected_tracebacks"]

DEBUG_ENV = "EMBEDLINE_DEBUG"

#: Loggers whose records carry a task's or flow's exception (Prefect's run loggers).
_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "prefect.task_engine", "prefect.flow_engine")


class ExpectedErrorFilter(logging.Filter):
    """Drop the traceback (not the record) of an expected ``EmbedlineError``."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, EmbedlineError) and not _debugging(record.name):
            record.exc_info = None
            record.exc_text = None
        return True


#: The chunk task's Prefect name (``tasks/embed/task.py``), whose final-state line is dropped.
CHUNK_TASK_NAME = "embed-chunk"
#: The Prefect name of the task that runs a group of chunks (``tasks/embed/groups.py``): its
#: final-state line is dropped too (the dispatcher logs each chunk's outcome).
GROUP_TASK_NAME = "embed-chunks"


class ChunkFinalStateFilter(logging.Filter):
    """Drop Prefect's ERROR ``Finished in state …`` and ``Task run failed with …`` records
    of an ``embed-chunk`` or ``embed-chunks`` task run (the dispatcher logs each chunk's
    outcome itself); keep everything else, and keep those too with ``--debug``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno < logging.ERROR
            or getattr(record, "task_name", None) not in (CHUNK_TASK_NAME, GROUP_TASK_NAME)
            or _debugging(record.name)
        ):
            return True
        return not str(record.msg).startswith(("Finished in state", "Task run failed with"))


def _debugging(logger_name: str) -> bool:
    return bool(os.environ.get(DEBUG_ENV)) or logging.getLogger(logger_name).isEnabledFor(
        logging.DEBUG
    )


_FILTER = ExpectedErrorFilter()
_CHUNK_STATE_FILTER = ChunkFinalStateFilter()


def quiet_expected_tracebacks() -> None:
    """Install the filter on Prefect's run loggers in this process (idempotent; call it in
    each process that runs flows or tasks, Dask workers included).

    Unless debugging, also turn off ``logging.raiseExceptions``: Prefect's API log handler
    then stops writing "--- Error logging to API ---" to stderr for each batch of log lines
    that did not reach a server that went away (the run reports that in one line itself).
    """
    if not os.environ.get(DEBUG_ENV):
        logging.raiseExceptions = False
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    task_runs = logging.getLogger("prefect.task_runs")
    if _CHUNK_STATE_FILTER not in task_runs.filters:
        task_runs.addFilter(_CHUNK_STATE_FILTER)
