"""Chunks with nothing to send, published by the flow process itself (no Prefect task run).

A chunk whose every non-empty row the reuse stage copied (``ReuseStage.fully_copied``: a
shuffled or re-exported night, a chunk whose only change is a kept column) needs no request
and waits for nobody: it is parsed, assembled and published. A Prefect task run costs about
60 ms of CPU between the client and the API server (measured: a 1,000,000-row reused night
in 200 chunks spent 14.5 s of its 48 s in the temporary server) — more than the chunk's own
work. So these chunks run on a small thread pool in the flow process with the chunk task's
own body (``tasks.embed.task.run_chunk``), and the ``Dispatcher`` records them like any chunk
(claim, ledger, progress, failures) through ``LocalFuture``, which answers the part of
Prefect's future interface it uses (``flows.chunk_futures``). The UI shows them in the flow's
log and artifacts, not as task runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from embedline.models import ChunkOutcome, ChunkSpec
from flows.chunk_futures import ChunkState

__all__ = ["LocalChunks", "LocalFuture"]


class LocalFuture:
    """A chunk running on ``LocalChunks``: ``wait()``, ``state``, ``result()`` and
    ``add_done_callback(fn)`` (``fn(future)``), as ``flows.dispatch.Dispatcher`` uses them."""

    def __init__(self, future: Future[ChunkOutcome]) -> None:
        self._future = future
        self._state: ChunkState | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the chunk ended (or ``timeout`` seconds passed)."""
        self._future.exception(timeout)

    @property
    def state(self) -> ChunkState:
        """Completed (data: the ``ChunkOutcome``), Cancelled (the run is stopping) or
        Failed (data: the exception); only once the chunk ended (``wait``)."""
        with self._lock:
            if self._state is None:
                error = self._future.exception()
                self._state = ChunkState.of(self._future.result() if error is None else error)
            return self._state

    def result(self) -> ChunkOutcome:
        """The outcome; raises the chunk's error."""
        return self._future.result()

    def add_done_callback(self, fn: Callable[[LocalFuture], None]) -> None:
        """Call ``fn(self)`` when the chunk ends (at once if it has)."""
        self._future.add_done_callback(lambda _: fn(self))


class LocalChunks:
    """A pool of ``workers`` threads running ``run(spec)`` for chunks the flow process
    publishes itself. ``close()`` waits for running ones (the dispatcher has recorded or
    released them by then)."""

    def __init__(self, run: Callable[[ChunkSpec], ChunkOutcome], *, workers: int = 2) -> None:
        self._run = run
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="embedline-copied")
        self.submitted = 0

    def submit(self, spec: ChunkSpec) -> LocalFuture:
        """Start chunk ``spec``; return its future."""
        self.submitted += 1
        return LocalFuture(self._pool.submit(self._run, spec))

    def close(self) -> None:
        """Stop taking chunks; wait for those running."""
        self._pool.shutdown(wait=True, cancel_futures=True)
