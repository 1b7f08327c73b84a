"""Chunks a lost Dask cluster leaves running: waited for, then counted from the store.

When the scheduler goes away (killed, its machine lost), every future the flow holds ends at
once with ``WorkerLostError`` (``flows.chunk_futures.end_state``), but the workers go on: a
worker that loses its scheduler closes, and closing waits for the chunk tasks it runs (up to
Dask's 30 s), which publish their chunks after the flow has given up on them. Reported as
they stood when the futures ended, the summary said "0 of 20 chunks are published" while
four were published seconds later, and their requests reached only the next run's count.

So the flow settles them before it reports: while a lost chunk's lease is held in the store
(``tasks.lease.chunk_lease.chunk_lease_held``: its task runs on some worker), it waits,
looking once a second, for at most the run's grace (``--grace``, seconds: the time a
stopping run gives chunks in flight); then each lost chunk whose object is in the store is
adopted (its object read, as a rerun would: ``tasks.publish.chunk_object.adopt_existing``)
and recorded as published. The spend records drained after it (``tasks/embed/spent.py``)
then hold what those tasks sent. A chunk still held when the grace runs out is left to the
rerun, which waits for its lease (``take_chunk_lease``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from adapters.ledger import Ledger
from embedline.errors import EmbedlineError, WorkerLostError
from embedline.models import ChunkSpec
from embedline.protocols import ObjectStore
from embedline.shutdown import STOP
from flows.dispatch import DispatchResult
from tasks.embed.paid import chunk_name
from tasks.lease.chunk_lease import POLL_S, chunk_lease_held
from tasks.publish.chunk_object import adopt_existing

__all__ = ["SettlingDispatch", "lost_chunks", "settle_lost_chunks"]

_THREADS = 16  # store requests at once (a LIST or a HEAD each)


class SettlingDispatch:
    """``dispatcher`` (a ``flows.signals.Stoppable``: ``flows.dispatch.Dispatcher``), then
    ``settle(result)`` (``settle_lost_chunks`` bound to the run: how many chunks are still
    held), as one piece of work under the run's signal handling: a first Ctrl-C or SIGTERM
    during the wait ends it, and the summary follows as after any stop."""

    def __init__(self, dispatcher: Any, settle: Callable[[DispatchResult], int]) -> None:
        self.dispatcher = dispatcher
        self.settle = settle

    def run(self, specs: Sequence[ChunkSpec]) -> DispatchResult:
        """The dispatcher's ``run``, then the wait for lost chunks; its result."""
        result: DispatchResult = self.dispatcher.run(specs)
        result.still_running = self.settle(result)
        return result

    def stop(self, *args: Any, **kwargs: Any) -> None:
        """The dispatcher's ``stop``; a signal also ends the wait (``STOP.dispatch``)."""
        self.dispatcher.stop(*args, **kwargs)


def lost_chunks(result: DispatchResult) -> list[int]:
    """Indexes of the chunks a lost cluster may still run or have published, in order: once
    a chunk task ended without a result because its worker or the scheduler went away
    (``WorkerLostError``), or the run stopped because the cluster had no worker left
    (``result.workers_lost``: a group task whose worker died after publishing some of its
    chunks never returns them), every chunk the flow holds as failed or released (a group
    task cancelled with its scheduler reads as released, whatever its running chunk then
    does); none otherwise."""
    lost = f"{WorkerLostError.__name__}:"
    if not result.workers_lost and not any(
        failure.error.startswith(lost) for failure in result.failed.values()
    ):
        return []
    return sorted({*result.failed, *result.released})


def settle_lost_chunks(
    result: DispatchResult,
    chunks: Sequence[ChunkSpec],
    *,
    store: ObjectStore,
    ledger: Ledger,
    run_key: str,
    model: str,
    wait_s: float,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait (at most ``wait_s`` seconds, or until a signal stops the run) while a lost chunk
    (``lost_chunks``) of ``chunks`` (the plan's, by index) holds its lease, then move each
    one published meanwhile from ``result.failed`` or ``result.released`` to
    ``result.published`` and the ledger
    (module docstring). Returns how many chunks were still held when the wait ended.

    A store that cannot be read ends the wait and adopts nothing more: the chunks stay
    failed, and the rerun adopts what was published (``tasks.plan.published``).
    """
    lost = [chunks[i] for i in lost_chunks(result)]
    if not lost:
        return 0
    held = _held(store, run_key, lost)
    if held:
        logger.warning(
            "the cluster went away with %d chunks running on its workers: waiting up to "
            "%.0f s (--grace) for them to end, so that this summary counts what they publish",
            len(held),
            wait_s,
        )
    deadline = clock() + wait_s
    while held and clock() < deadline and STOP.dispatch.stop_signal() is None:
        sleep(POLL_S)
        held = _held(store, run_key, held)
    with ThreadPoolExecutor(_THREADS) as pool:
        outcomes = list(pool.map(lambda spec: _adopted(store, spec, model), lost))
    for spec, outcome in zip(lost, outcomes, strict=True):
        if outcome is None:
            continue
        ledger.record_published(
            run_key, spec, outcome, object_uri=store.uri_for(outcome.object_key)
        )
        result.failed.pop(spec.index, None)
        result.released.pop(spec.index, None)
        result.published[spec.index] = outcome
    adopted = sum(o is not None for o in outcomes)
    if adopted:
        logger.info("%d chunks the lost cluster was running published after all", adopted)
    return len(held)


def _held(store: ObjectStore, run_key: str, specs: Sequence[ChunkSpec]) -> list[ChunkSpec]:
    """The chunks of ``specs`` whose lease a task holds; none if the store cannot be listed."""

    def holds(spec: ChunkSpec) -> bool:
        return chunk_lease_held(store, run_key, chunk_name(spec.object_key))

    try:
        with ThreadPoolExecutor(_THREADS) as pool:
            return [s for s, h in zip(specs, pool.map(holds, specs), strict=True) if h]
    except (EmbedlineError, OSError):
        return []


def _adopted(store: ObjectStore, spec: ChunkSpec, model: str) -> Any:
    """The chunk's outcome from its object in the store (one GET), or None: not there
    (``FileNotFoundError``, an ``OSError``), or unreadable."""
    try:
        return adopt_existing(store, spec, model=model)
    except (EmbedlineError, OSError):
        return None
