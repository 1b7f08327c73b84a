"""Futures of single chunks that do not run as a task run of their own, as the dispatcher
reads them: chunks the flow process publishes itself (``flows.local_chunks``) and the chunks
of a group's task run (``tasks.embed.groups``, ``chunks_of``).

``flows.dispatch.Dispatcher`` records chunk by chunk: it calls ``wait()``, reads ``state``
(``is_completed()``, ``is_cancelled()``, ``is_pending()``, ``is_final()``,
``result(raise_on_failure=False)``, ``message``, ``type.value``), calls ``result()`` and
``add_done_callback(fn)``, as on a Prefect future. ``ChunkState`` answers that part of a
Prefect state. A chunk that a group never started (it stopped before it) is Pending: the
dispatcher gives it back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from embedline.errors import StopRequestedError, WorkerLostError
from embedline.models import ChunkOutcome
from tasks.embed.groups import GroupOutcome

__all__ = ["ChunkOfGroup", "ChunkState", "StateType", "chunks_of", "end_state"]


class StateType(Enum):
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PENDING = "PENDING"


@dataclass(frozen=True, slots=True)
class ChunkState:
    """The end state of one chunk, shaped like the Prefect states the dispatcher reads."""

    type: StateType
    data: Any = None
    message: str = ""

    def is_completed(self) -> bool:
        return self.type is StateType.COMPLETED

    def is_cancelled(self) -> bool:
        return self.type is StateType.CANCELLED

    def is_pending(self) -> bool:
        return self.type is StateType.PENDING

    def is_final(self) -> bool:
        return self.type is not StateType.PENDING

    def result(self, raise_on_failure: bool = True) -> Any:
        if raise_on_failure and isinstance(self.data, BaseException):
            raise self.data
        return self.data

    @classmethod
    def of(cls, outcome: ChunkOutcome | BaseException | None) -> ChunkState:
        """A chunk's state from what its run gave: its outcome (Completed), the
        ``StopRequestedError`` of a stopping run (Cancelled), another exception (Failed), or
        None (Pending: never started)."""
        if outcome is None:
            return cls(StateType.PENDING, message="not started: its group stopped before it")
        if isinstance(outcome, StopRequestedError):
            return cls(StateType.CANCELLED, outcome, f"{type(outcome).__name__}: {outcome}")
        if isinstance(outcome, BaseException):
            return cls(StateType.FAILED, outcome, str(outcome))
        return cls(StateType.COMPLETED, outcome)


#: A distributed future's status once its task cannot report any more (distributed/client.py).
_GONE = frozenset({"error", "cancelled", "lost"})


def end_state(future: Any) -> Any:
    """The end state of a task run's Prefect ``future``, after ``future.wait()``: its own,
    or a Failed ``ChunkState`` holding a ``WorkerLostError`` when the task never reported
    its end because its process went away (a killed Dask worker, a lost scheduler: the
    distributed future ended in error while the task run still reads Running, and Prefect's
    ``state.result()`` would raise ``UnfinishedRun``)."""
    state = future.state
    if state.is_final():
        return state
    wrapped = getattr(future, "wrapped_future", None)
    status = getattr(wrapped, "status", None)  # a distributed.Future's; threads have none
    if status not in _GONE:
        return state
    error = WorkerLostError(  # one text for every chunk: the dispatcher logs it once
        f"a chunk task ended without a result ({status}): its Dask worker or the scheduler "
        "went away: rerun the same command to resume"
    )
    return ChunkState(StateType.FAILED, error, str(error))


class _GroupStates:
    """The chunk states of one group's task run, read once from its Prefect future."""

    def __init__(self, future: Any, size: int) -> None:
        self.future = future
        self._size = size
        self._states: list[ChunkState] | None = None
        self._lock = threading.Lock()

    def state(self, position: int) -> ChunkState:
        with self._lock:
            if self._states is None:
                self.future.wait()  # sets the final state locally: .state does not ask the API
                self._states = self._read(end_state(self.future))
            return self._states[position]

    def _read(self, state: Any) -> list[ChunkState]:
        data = state.result(raise_on_failure=False)
        if isinstance(data, GroupOutcome):
            return [ChunkState.of(o) for o in data.outcomes]
        if state.is_cancelled():  # stopped before it could say what each chunk did
            cancelled = ChunkState(StateType.CANCELLED, None, state.message or "cancelled")
            return [cancelled] * self._size
        error = (
            data
            if isinstance(data, BaseException)
            else RuntimeError(f"chunk task ended in state {state.type.value}")
        )
        return [ChunkState(StateType.FAILED, error, str(error))] * self._size


class ChunkOfGroup:
    """One chunk of a group's task run, as a future of its own (module docstring)."""

    def __init__(self, group: _GroupStates, position: int) -> None:
        self._group = group
        self._position = position

    def wait(self, timeout: float | None = None) -> None:
        """Block until the group's task run ended (or ``timeout`` seconds passed)."""
        self._group.future.wait(timeout)

    @property
    def state(self) -> ChunkState:
        """The chunk's end state (waits for the group's)."""
        return self._group.state(self._position)

    def result(self) -> ChunkOutcome:
        """The chunk's outcome; raises its error."""
        return self.state.result()  # type: ignore[no-any-return]

    def add_done_callback(self, fn: Callable[[ChunkOfGroup], None]) -> None:
        """Call ``fn(self)`` when the group's task run ends (at once if it has)."""
        self._group.future.add_done_callback(lambda _: fn(self))


def chunks_of(future: Any, size: int) -> list[ChunkOfGroup]:
    """The ``size`` chunks of a group's task run (its Prefect ``future``), in group order."""
    group = _GroupStates(future, size)
    return [ChunkOfGroup(group, n) for n in range(size)]
