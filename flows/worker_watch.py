"""A cluster by address whose workers all left mid-run: the run stops in one line.

``warm_up`` waits for a first worker before any chunk (``flows.task_runner``). Once the run
dispatches, a scheduler that loses its last worker (killed, evicted, its machine gone) keeps
every chunk task run queued for a worker that may never come, and the command printed
"progress 0 of N" for as long as it was left running. Dask itself waits without a bound: a
platform that restarts workers (Kubernetes, systemd) brings one back in seconds. So while
chunks are in flight the flow looks at the scheduler's worker list (``cluster_workers``: one
request to the scheduler, at most every ``LOOK_EVERY_S``, from the dispatch loop); once it has
been empty for the same wait a run gives a first worker (``WORKER_WAIT_S``, or
``EMBEDLINE_DASK_WORKER_WAIT_S``), the dispatch stops as after an outage: in-flight chunks
are released, the line says to start workers and rerun, exit 1. A worker that joins within
the wait goes on with the run.

Not ``Client.scheduler_info()``: it asks the scheduler, then returns the client's cached
identity, which the client's own refresh (every 2 s, distributed's
``scheduler-info-interval``) replaces with one that lists no worker; a refresh landing
between the two read as "no workers left" on a cluster whose worker was running a chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["WorkerWatch", "cluster_workers"]

#: Seconds between two looks at the worker list.
LOOK_EVERY_S = 1.0
#: Seconds a look at the worker list waits for the scheduler's answer.
ANSWER_WAIT_S = 2.0


def cluster_workers(client: Any, timeout_s: float = ANSWER_WAIT_S) -> dict[str, Any] | None:
    """The scheduler's workers now, as ``{address: identity}`` (each a dict with ``name``,
    ``nthreads``, ``status``…), asked of the scheduler (``Scheduler.identity``); None when
    ``client`` (a ``distributed.Client``) is not connected or no answer came within
    ``timeout_s`` seconds: unknown, not empty."""
    if client.status != "running" or client.scheduler is None:
        return None
    try:
        identity = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout_s)
    except (OSError, TimeoutError):  # CommClosedError is an OSError
        return None
    return dict(identity.get("workers") or {})


class WorkerWatch:
    """Watches ``client`` (a ``distributed.Client`` of the scheduler at ``address``) for a
    worker list empty for ``wait_s`` seconds; ``logger`` gets one warning when it empties."""

    def __init__(
        self,
        client: Any,
        address: str,
        wait_s: float,
        logger: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.address = address
        self.wait_s = wait_s
        self.logger = logger
        self.clock = clock
        self._looked = float("-inf")
        self._empty_since: float | None = None

    def gone_for_good(self) -> str | None:
        """None while the cluster has a worker, or has had none for less than ``wait_s``;
        then the run's stop line (``ChunkFailure.error``, kind ``outage``)."""
        now = self.clock()
        if now - self._looked < LOOK_EVERY_S:
            return None
        self._looked = now
        workers = cluster_workers(self.client)
        if workers is None:  # the scheduler is lost or slow: flows.lost_chunks handles it
            return None
        if workers:
            self._empty_since = None
            return None
        if self._empty_since is None:
            self._empty_since = now
            self.logger.warning(
                "the Dask scheduler at %s has no workers left: waiting up to %g s for one",
                self.address,
                self.wait_s,
            )
        if now - self._empty_since < self.wait_s:
            return None
        return (
            f"the Dask scheduler at {self.address} has had no workers for {self.wait_s:g} s: "
            f"start workers with `dask worker {self.address}`, then rerun the same command "
            "to resume"
        )
