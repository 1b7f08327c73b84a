"""``flows.chunk_futures.end_state``: a task run that never reported its end because its
process went away reads as a failed chunk with ``WorkerLostError``, not Prefect's
``UnfinishedRun``; every other state passes through as it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from prefect.states import Completed, Failed, Pending, Running

from embedline.errors import WorkerLostError
from flows.chunk_futures import ChunkState, StateType, end_state
from tasks.embed.failures import retryable, status_for


@dataclass
class _Wrapped:
    status: str  # a distributed.Future's: pending, finished, error, cancelled, lost


@dataclass
class _Future:
    state: Any
    wrapped_future: Any = None


@pytest.mark.parametrize("status", ["cancelled", "error", "lost"])
@pytest.mark.parametrize("state", [Running(), Pending()], ids=["running", "pending"])
def test_a_task_whose_process_went_away_is_a_failed_chunk(status: str, state: Any) -> None:
    got = end_state(_Future(state, _Wrapped(status)))
    assert got.type is StateType.FAILED
    error = got.result(raise_on_failure=False)
    assert isinstance(error, WorkerLostError)
    assert "rerun the same command to resume" in str(error)
    failure = status_for(error)
    assert failure.kind == "outage"  # the run dispatches no more chunks, exits 1
    assert not retryable(error)  # a Prefect retry of a lost task would be lost too


@pytest.mark.parametrize(
    "future",
    [
        _Future(Completed(data=1), _Wrapped("finished")),
        _Future(Failed(data=ValueError("x")), _Wrapped("error")),
        _Future(Running(), _Wrapped("pending")),  # still running somewhere: not lost
        _Future(Running(), None),  # a thread's future: its process cannot go away
        _Future(ChunkState(StateType.PENDING)),  # a group never started it: given back
    ],
    ids=["completed", "failed", "in-flight", "thread", "group-pending"],
)
def test_every_other_state_passes_through(future: _Future) -> None:
    assert end_state(future) is future.state
