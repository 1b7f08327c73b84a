"""``flows.dask_logging``: a local Dask worker (and the CLI's client) drops the traceback
of its scheduler's connection closing (the CLI says how the run ended), and keeps every
other record."""

from __future__ import annotations

import logging
import sys

import pytest

from flows.dask_logging import SchedulerGoneFilter


def _record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:  # noqa: BLE001
        info = sys.exc_info()
    return logging.LogRecord(
        "distributed.worker",
        logging.ERROR,
        __file__,
        1,
        "Failed to communicate with scheduler during heartbeat.",
        None,
        info,
    )


def test_a_closed_scheduler_connection_is_dropped_however_deep_in_the_chain() -> None:
    from distributed.comm.core import CommClosedError

    def heartbeat() -> None:  # the chain a worker logged in CI
        try:
            raise TimeoutError
        except TimeoutError:
            raise CommClosedError("ConnectionPool closing.")  # noqa: B904

    try:
        heartbeat()
    except CommClosedError as exc:
        assert not SchedulerGoneFilter().filter(_record(exc))
    wrapped = RuntimeError("while closing")
    wrapped.__cause__ = CommClosedError("in-flight")
    assert not SchedulerGoneFilter().filter(_record(wrapped))


@pytest.mark.parametrize("exc", [MemoryError(), ValueError("a task failed")])
def test_any_other_worker_error_is_kept(exc: BaseException) -> None:
    assert SchedulerGoneFilter().filter(_record(exc))
    plain = logging.LogRecord(
        "distributed.worker",
        logging.WARNING,
        __file__,
        1,
        "Worker is at 85% memory usage",
        None,
        None,
    )
    assert SchedulerGoneFilter().filter(plain)
