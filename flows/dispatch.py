"""Run chunk tasks with a bounded number in flight and record each outcome in the ledger.

Orchestration only: the dispatcher cuts the chunks into groups (``group``; one chunk each by
default, ``tasks.embed.groups`` for the flow's chunk tasks), claims a group's chunks (a lease
in the ledger each), submits the group (one future per chunk), and records each chunk's
outcome when its future completes. The flow process is the ledger's only writer. At most
``window`` groups are in flight, so memory stays flat however large the input is.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.ledger import Ledger, new_owner
from embedline.models import ChunkOutcome, ChunkSpec
from embedline.progress import Usage
from embedline.shutdown import STOP
from embedline.tracebacks import DEBUG_ENV
from flows.chunk_futures import end_state
from tasks.embed.failures import ChunkFailure, status_for

__all__ = ["DispatchResult", "Dispatched", "Dispatcher"]

_POLL_S = 0.5  # seconds between checks of held chunks and leases


@dataclass(slots=True)
class DispatchResult:
    """Outcomes by chunk index; ``stop`` is the failure that stopped dispatching, if any;
    ``workers_lost``: the run stopped because its Dask cluster had no worker left
    (``flows.worker_watch``); ``still_running``: chunks a lost Dask cluster's workers still
    ran when the flow stopped waiting for them (``flows.lost_chunks``)."""

    published: dict[int, ChunkOutcome] = field(default_factory=dict)
    published_elsewhere: dict[int, ChunkOutcome] = field(default_factory=dict)
    failed: dict[int, ChunkFailure] = field(default_factory=dict)
    released: dict[int, ChunkFailure] = field(default_factory=dict)
    not_run: list[int] = field(default_factory=list)
    stop: ChunkFailure | None = None
    workers_lost: bool = False
    still_running: int = 0  # chunks a lost cluster still ran when the flow stopped waiting


@dataclass(frozen=True, slots=True)
class Dispatched:
    """What a run's embed and publish stage did: the dispatch's ``result`` and, with chunks
    run in this process (threads), ``cost`` (``Usage``: requests, tokens, inputs charged,
    requests retried) every chunk of this process sent — failed, retried and released
    attempts too; on Dask the spend records drained from the store
    (``tasks/embed/spent.py``); None in Batch API mode on Dask (the outcomes' counts)."""

    result: DispatchResult
    cost: Usage | None
    batches: int = 0  # Batch API batches of the chunks this run embedded


Group = tuple[ChunkSpec, ...]


def _one_each(specs: Sequence[ChunkSpec]) -> list[Group]:
    return [(spec,) for spec in specs]


class Dispatcher:
    """Claims, submits and records chunks. ``group(specs)`` cuts the chunks to dispatch into
    groups of consecutive chunks (default: one chunk each); ``submit(group)`` starts one and
    returns a future per chunk, in order (a Prefect future, or one of ``flows.chunk_futures``).
    A chunk its group never started (Pending: the group stopped at a chunk that stops the
    run or was released, or because dispatching stops) is given back in the ledger
    (``pending``) and counted as not run, as a chunk never submitted.

    ``lease_s`` (seconds) is how long a claim holds without renewal; leases of in-flight
    chunks are renewed every ``lease_s / 3``. ``on_outcome`` is called after each record,
    ``on_tick`` at least every 0.5 s while chunks are in flight (progress between outcomes).
    When the Prefect API goes away (``STOP.report.api_lost``), dispatching stops as after a
    first signal: in-flight chunks get ``grace_s`` seconds, then are released.
    ``on_stop`` is called once, when dispatching first stops (a run on Dask writes its stop
    marker there: ``tasks/lease/run_stop.py``).
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        run_key: str,
        object_uri: Callable[[ChunkSpec], str],
        submit: Callable[[Group], Sequence[Any]],
        window: int,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        lease_s: float = 600.0,
        on_outcome: Callable[[DispatchResult], None] | None = None,
        on_tick: Callable[[DispatchResult], None] | None = None,
        on_gave_up: Callable[[int], None] | None = None,
        grace_s: float = 30.0,
        group: Callable[[Sequence[ChunkSpec]], Sequence[Group]] = _one_each,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.on_stop = on_stop or (lambda: None)
        self.ledger = ledger
        self.run_key = run_key
        self.object_uri = object_uri
        self.submit = submit
        self.window = window
        self.logger = logger
        self.lease_s = lease_s
        self.on_outcome = on_outcome or (lambda result: None)
        self.on_tick = on_tick or (lambda result: None)
        self.on_gave_up = on_gave_up or (lambda index: None)
        self.grace_s = grace_s
        self.group = group
        self.owner = new_owner()
        self.result = DispatchResult()
        self._done: queue.Queue[Any] = queue.Queue()
        self._inflight: dict[Any, ChunkSpec] = {}
        self._group_of: dict[Any, int] = {}  # future -> its group's number
        self._groups: dict[int, int] = {}  # group number -> its chunks not recorded yet
        self._submitted = 0  # groups submitted so far (their numbers)
        self._unstarted: list[int] = []  # not started by their group: not run
        self._stopping = False
        self._deadline = float("inf")
        self._same_as_stop: list[int] = []  # failed later with the error that stopped the run

    def stop(self, failure: ChunkFailure | None = None, *, grace_s: float | None = None) -> None:
        """Submit no more chunks; in-flight chunks finish and are recorded.

        With ``grace_s`` (seconds), chunks still in flight when it runs out are released in
        the ledger (back to ``pending``) and ``run`` returns without waiting for them.
        """
        if not self._stopping:
            self.on_stop()
        self._stopping = True
        STOP.dispatch.hold_new_chunks()  # a running group starts no further chunk
        if grace_s is not None:
            self._deadline = min(self._deadline, time.monotonic() + grace_s)
        if failure is not None and self.result.stop is None:
            self.result.stop = failure

    def run(self, specs: Sequence[ChunkSpec]) -> DispatchResult:
        """Process ``specs``; return when every chunk is recorded or dispatching stopped."""
        pending: deque[Group] = deque(self.group(specs))
        held: list[ChunkSpec] = []
        renewed = time.monotonic()
        while pending or held or self._inflight:
            if not self._stopping and STOP.report.api_lost() is not None:
                self.logger.info(
                    "the Prefect API went away: no new chunks; in-flight chunks get %g s to finish",
                    self.grace_s,
                )
                self.stop(grace_s=self.grace_s)
            if not self._stopping:
                self._fill(pending, held)
            if self._stopping and not self._inflight:
                break
            if time.monotonic() > self._deadline:
                self._release_inflight("grace period over while stopping")
                break
            self._drain(timeout=_POLL_S)
            self.on_tick(self.result)
            if held and not self._stopping:
                pending.extend((spec,) for spec in held)
                held.clear()
            if time.monotonic() - renewed > self.lease_s / 3:
                self.ledger.renew(
                    self.run_key,
                    [s.index for s in self._inflight.values()],
                    owner=self.owner,
                    lease_s=self.lease_s,
                )
                renewed = time.monotonic()
        left = [spec.index for group in pending for spec in group]
        self.result.not_run = sorted({*left, *(s.index for s in held), *self._unstarted})
        if self._same_as_stop:
            self.logger.error(
                "%d more in-flight chunks failed with the same error: %s",
                len(self._same_as_stop),
                _ranges(self._same_as_stop),
            )
        return self.result

    def _release_inflight(self, why: str) -> None:
        STOP.dispatch.stop_tasks()  # running chunk tasks stop before their next request
        for spec in self._inflight.values():
            self.ledger.release(self.run_key, spec.index, owner=self.owner, error=why)
            self.result.released[spec.index] = ChunkFailure("released", why, expected=True)
            self.on_gave_up(spec.index)
        self._inflight.clear()
        self._group_of.clear()
        self._groups.clear()

    def _fill(self, pending: deque[Group], held: list[ChunkSpec]) -> None:
        while pending and len(self._groups) < self.window:
            claimed = tuple(spec for spec in pending.popleft() if self._claim(spec, held))
            if not claimed:
                continue
            number = self._submitted = self._submitted + 1
            futures = self.submit(claimed)
            self._groups[number] = len(claimed)
            for spec, future in zip(claimed, futures, strict=True):
                self._inflight[future] = spec
                self._group_of[future] = number
                future.add_done_callback(self._done.put)

    def _claim(self, spec: ChunkSpec, held: list[ChunkSpec]) -> bool:
        """Claim ``spec`` for this dispatch; False if it was published meanwhile by a
        concurrent run (recorded as such) or another live process holds it (``held``)."""
        record = self.ledger.published_object(self.object_uri(spec))
        if record is not None:  # published meanwhile by a concurrent run
            self.result.published_elsewhere[spec.index] = ChunkOutcome(
                index=spec.index,
                key=spec.key,
                object_key=spec.object_key,
                object_sha256=record.sha256,
                rows=record.rows,
                dead_letters=tuple(self.ledger.chunk_dead_letters(spec)),
                created=False,
            )
            return False
        if not self.ledger.claim(self.run_key, spec.index, owner=self.owner, lease_s=self.lease_s):
            held.append(spec)  # another live process holds it: look again later
            return False
        return True

    def _drain(self, *, timeout: float) -> None:
        try:
            future = self._done.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            if future in self._inflight:  # else released when the grace period ran out
                self._record(future, self._inflight.pop(future))
                self._recorded(future)
            try:
                future = self._done.get_nowait()
            except queue.Empty:
                return

    def _recorded(self, future: Any) -> None:
        """Count ``future``'s chunk out of its group; a group all recorded leaves the window."""
        number = self._group_of.pop(future)
        self._groups[number] -= 1
        if not self._groups[number]:
            del self._groups[number]

    def _record(self, future: Any, spec: ChunkSpec) -> None:
        future.wait()  # sets the final state locally; before it, .state asks the API server
        state = end_state(future)
        if state.is_pending():  # its group stopped before it: never started
            self.ledger.release(self.run_key, spec.index, owner=self.owner)
            self._unstarted.append(spec.index)
            self.on_gave_up(spec.index)  # chunks waiting for it stop waiting
            self.on_outcome(self.result)
            return
        if state.is_completed():
            outcome: ChunkOutcome = future.result()
            self.ledger.record_published(
                self.run_key, spec, outcome, object_uri=self.object_uri(spec)
            )
            self.result.published[spec.index] = outcome
        else:
            if state.is_cancelled():  # the task released its chunk: the run is stopping
                exc = None
                failure = ChunkFailure("released", state.message or "cancelled", expected=True)
            else:
                exc = state.result(raise_on_failure=False)
                failure = status_for(
                    exc
                    if isinstance(exc, BaseException)
                    else RuntimeError(f"chunk task ended in state {state.type.value}")
                )
            if failure.kind == "released":
                self.logger.warning(
                    "chunk %d released for a later run: %s", spec.index, failure.error
                )
                self.ledger.release(self.run_key, spec.index, owner=self.owner, error=failure.error)
                self.result.released[spec.index] = failure
                self.on_gave_up(spec.index)
                self.on_outcome(self.result)
                return
            stop = self.result.stop
            if stop is not None and failure.error == stop.error:
                self._same_as_stop.append(spec.index)  # a latched error: one line at the end
            else:
                self._log_failure(spec, failure, exc)
            self.ledger.mark_failed(self.run_key, spec.index, owner=self.owner, error=failure.error)
            self.result.failed[spec.index] = failure
            self.on_gave_up(spec.index)
            if failure.kind in ("fatal", "input", "outage"):
                self.stop(failure)
        self.on_outcome(self.result)

    def _log_failure(self, spec: ChunkSpec, failure: ChunkFailure, exc: object) -> None:
        if failure.expected:  # its traceback only with --debug (EMBEDLINE_DEBUG)
            debug = isinstance(exc, BaseException) and bool(os.environ.get(DEBUG_ENV))
            self.logger.error(
                "chunk %d failed: %s",
                spec.index,
                failure.error,
                exc_info=exc if debug and isinstance(exc, BaseException) else None,
            )
        else:
            self.logger.error(
                "chunk %d failed with an unexpected error: %s",
                spec.index,
                failure.error,
                exc_info=exc if isinstance(exc, BaseException) else None,
            )


def _ranges(indexes: Sequence[int]) -> str:
    """``[0, 2, 3, 4, 7]`` -> ``"chunks 0, 2-4, 7"``."""
    spans: list[list[int]] = []
    for index in sorted(indexes):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return "chunks " + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
