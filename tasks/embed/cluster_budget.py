"""One RPM/TPM budget for every worker of a Dask cluster: the GCRA pacer of
``adapters.rate_limit`` held once, on the scheduler, and asked by each worker before each
request.

``install_budget`` (run on the scheduler by the flow, ``Client.run_on_scheduler``) adds one
scheduler handler, ``embedline_budget``. A worker's ``ClusterPacer.reserve`` is one round
trip to it: the scheduler books the request against the budget's ``RequestPacer`` and
answers how long to wait before sending, as a process's own pacer does; the worker sleeps
that long. A TPM correction (the answers' ``usage`` and their estimates, each summed since
the worker's last reservation) rides on the worker's next reservation, so each request costs
one round trip; both sums, not only their difference, let the pacer learn how heavy a
request turns out against its estimate. The budget is named by what it belongs to
(``budget_name``: the API key's digest, the base URL and the model), so runs that overlap on
one cluster and one account share it, and workers that join later ask the same one.

The handler and the pacer are shipped to the scheduler by value (cloudpickle), so a
scheduler that does not have embedline installed holds the budget too. Imported only for
``--task-runner dask`` (it imports distributed).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import adapters.rate_limit
from adapters.embeddings.endpoint import api_key_from_env
from adapters.rate_limit import RequestPacer
from embedline.errors import FatalError
from embedline.settings import RunSettings
from tasks.embed.dask_worker import this_worker

__all__ = [
    "HANDLER",
    "ClusterPacer",
    "budget_name",
    "cluster_pacer",
    "install_budget",
    "ship_by_value",
]

#: The scheduler handler's name (``Scheduler.handlers``), i.e. the RPC operation workers call.
HANDLER = "embedline_budget"


def budget_name(settings: RunSettings, api_key: str | None) -> str:
    """The budget's name: a digest of the API key's digest, the base URL and the model (the
    key itself never leaves this process)."""
    key_digest = hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""
    owner = "\n".join((key_digest, settings.base_url, settings.effective_model))
    return "embedline-budget-" + hashlib.sha256(owner.encode()).hexdigest()[:16]


def install_budget(dask_scheduler: Any) -> bool:
    """Add the ``embedline_budget`` handler to ``dask_scheduler`` (``run_on_scheduler``);
    idempotent: a second run (another flow on the same cluster) keeps the budgets held."""
    if HANDLER in dask_scheduler.handlers:
        return False
    pacers: dict[str, RequestPacer] = {}
    lock = threading.Lock()

    def reserve(
        name: str,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        estimated: int = 0,
        used: int = 0,
    ) -> float:
        with lock:
            pacer = pacers.get(name)
            if pacer is None or (pacer.rpm, pacer.tpm) != (rpm, tpm):
                pacer = _resized(pacer, rpm, tpm)
                pacers[name] = pacer
        if estimated or used:
            pacer.correct(estimated=estimated, used=used)
        return pacer.reserve(tokens)

    dask_scheduler.handlers[HANDLER] = reserve
    return True


def _resized(old: RequestPacer | None, rpm: int | None, tpm: int | None) -> RequestPacer:
    """A pacer for new limits that keeps the old one's bookings (no burst on a change)."""
    new = RequestPacer(rpm=rpm, tpm=tpm)
    if old is not None:
        new.carry_over(old)
    return new


def ship_by_value() -> None:
    """Pickle this module and ``adapters.rate_limit`` by value, so the scheduler needs
    neither installed."""
    import sys

    import cloudpickle  # type: ignore[import-untyped]

    cloudpickle.register_pickle_by_value(adapters.rate_limit)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ClusterPacer:
    """The worker's side of a cluster budget: ``reserve``/``correct`` as ``RequestPacer``'s,
    each reservation one round trip to the scheduler's handler.

    :param name: the budget's name (``budget_name``).
    :param worker: the ``distributed.Worker`` of this process.
    """

    def __init__(self, name: str, *, rpm: int | None, tpm: int | None, worker: Any) -> None:
        self.name = name
        self.rpm = rpm
        self.tpm = tpm
        self._worker = worker
        self._lock = threading.Lock()
        self._estimated = 0  # estimated tokens of the answers not yet carried
        self._used = 0  # and the tokens they used

    def __repr__(self) -> str:
        return f"ClusterPacer({self.name!r}, rpm={self.rpm!r}, tpm={self.tpm!r})"

    @property
    def enabled(self) -> bool:
        """True when at least one limit is set."""
        return self.rpm is not None or self.tpm is not None

    def reserve(self, tokens: int) -> float:
        """Book one request of ``tokens`` (estimated) tokens on the scheduler; return the
        seconds to wait before sending it.

        :raises FatalError: the scheduler has no budget handler (a scheduler that restarted
            after the flow installed it): the run stops rather than send unpaced.
        """
        from distributed.utils import sync

        with self._lock:
            estimated, used = self._estimated, self._used
            self._estimated = self._used = 0
        worker = self._worker
        call = getattr(worker.scheduler, HANDLER)
        wait = sync(
            worker.loop,
            call,
            name=self.name,
            rpm=self.rpm,
            tpm=self.tpm,
            tokens=tokens,
            estimated=estimated,
            used=used,
        )
        if wait is None:  # distributed answers None for an operation it has no handler for
            raise FatalError(
                f"the Dask scheduler {worker.scheduler.address} holds no rate budget (it "
                "restarted?): --rpm/--tpm cannot be held; rerun to resume"
            )
        return float(wait)

    def correct(self, *, estimated: int, used: int) -> None:
        """Carry ``estimated`` and ``used`` tokens to the next reservation (no TPM: nothing);
        an exact estimate too, as it counts toward the ratio the pacer learns."""
        if self.tpm is not None:
            with self._lock:
                self._estimated += estimated
                self._used += used


def cluster_pacer(settings: RunSettings) -> ClusterPacer | None:
    """The cluster budget's pacer for a chunk task on a Dask worker with ``--rpm`` or
    ``--tpm``; None elsewhere (the process's own pacer then holds the limits)."""
    if settings.task_runner != "dask" or (settings.rpm is None and settings.tpm is None):
        return None
    worker = this_worker()
    if worker is None:
        return None
    name = budget_name(settings, api_key_from_env())
    return ClusterPacer(name, rpm=settings.rpm, tpm=settings.tpm, worker=worker)
