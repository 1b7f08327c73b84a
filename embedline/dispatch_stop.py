"""What is stopping the flow's dispatch of chunks: the signal that started the graceful stop,
Prefect's ``TerminationSignal`` kept for the flow to raise again, and the chunk tasks' stop.

One per process, ``STOP.dispatch`` (``embedline.shutdown``), cleared each time a flow starts
dispatching. ``flows.signals`` writes it, the flow reads it for its summary, chunk tasks read
``tasks_must_stop`` before each request, group tasks ``new_chunks_held`` before each chunk.
Plain state: no handler, no exit.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["DispatchStop"]


class DispatchStop:
    """What stops the current dispatch (module docstring). ``owner``: the object whose
    ``dispatch`` attribute this is; a pickled ``DispatchStop`` is the receiving process's
    own, as its owner is (its event cannot be copied)."""

    def __init__(self, owner: object) -> None:
        self._owner = owner
        #: The signal that stopped dispatching (``note_stop_signal``).
        self._signal: int | None = None
        #: Prefect's ``TerminationSignal`` that started a graceful stop under a runner.
        self._termination: BaseException | None = None
        self._tasks_stop = threading.Event()
        self._hold_chunks = threading.Event()

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (self._owner, "dispatch"))

    def clear(self) -> None:
        """A new dispatch: forget the last one's stop signal, termination and tasks' stop (a
        long-lived process runs several runs)."""
        self._signal = self._termination = None
        self._tasks_stop.clear()
        self._hold_chunks.clear()

    def note_stop_signal(self, signum: int) -> None:
        """``flows.signals``: the first signal while dispatching is recorded (the run is
        stopping because of ``signum``); ``flows.signals`` exits at once on a second one."""
        self._signal = signum

    def stop_signal(self) -> int | None:
        """The signal that is stopping the dispatch, if any."""
        return self._signal

    def note_termination(self, exc: BaseException) -> None:
        """Keep Prefect's ``TerminationSignal`` that started a graceful stop in a flow run
        under a Prefect runner, for the flow to raise again once the run is recorded (the
        first one only)."""
        if self._termination is None:
            self._termination = exc

    def pending_termination(self) -> BaseException | None:
        """The ``TerminationSignal`` ``note_termination`` kept, if any."""
        return self._termination

    def stop_tasks(self) -> None:
        """Ask every chunk task of this process to stop before its next request."""
        self._tasks_stop.set()

    def hold_new_chunks(self) -> None:
        """The dispatcher submits no more chunks: a group task of this process starts no
        further chunk of its group either (``tasks.embed.task.run_group``)."""
        self._hold_chunks.set()

    def new_chunks_held(self) -> bool:
        """True once ``hold_new_chunks`` was called (until the next dispatch: ``clear``)."""
        return self._hold_chunks.is_set()

    def tasks_must_stop(self) -> bool:
        """True once ``stop_tasks`` was called (until the next dispatch: ``clear``)."""
        return self._tasks_stop.is_set()
