"""The ``embed-csv`` flow's task runner: threads in the flow's process, or Dask workers (a
local cluster the flow starts, a running one at ``dask_address``, or one prefect-dask starts
from ``dask_cluster_class`` and ``dask_cluster_kwargs``)."""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import Any

from prefect.task_runners import ThreadPoolTaskRunner

from embedline.errors import InputError
from embedline.settings import RunSettings
from embedline.shutdown import STOP
from embedline.tracebacks import DEBUG_ENV
from flows.worker_watch import cluster_workers
from tasks.embed.task import warm_worker

__all__ = ["in_flight", "task_runner", "warm_up", "worker_wait_s"]

#: Dask's level for its ``distributed`` loggers, read from the environment when ``dask`` is
#: imported, here and in each worker process the nanny spawns (Dask configuration docs:
#: ``DASK_`` variables, ``__`` for nesting).
_DASK_LOG_LEVEL_ENV = "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED"
#: Seconds a run by ``--dask-address`` waits for a first worker of a cluster that has none
#: (workers still starting); ``EMBEDLINE_DASK_WORKER_WAIT_S`` sets another.
WORKER_WAIT_S = 60.0

_log = logging.getLogger(__name__)


def task_runner(settings: RunSettings, window: int) -> Any:
    """The Prefect task runner for ``settings.task_runner``: a ``ThreadPoolTaskRunner`` of
    ``window`` threads, or a ``DaskTaskRunner``: the scheduler at ``dask_address``;
    ``dask_cluster_class(**dask_cluster_kwargs)``, which sizes itself; or a local cluster of
    ``settings.dask_workers`` worker processes, each with the threads one process runs
    (``--concurrency`` + 1: one chunk between requests; with the local embedder, ``window``
    threads spread over the workers).

    :raises InputError: ``dask`` without prefect-dask installed; a cluster class that does not
        import.
    """
    if settings.task_runner == "threads":
        return ThreadPoolTaskRunner(max_workers=window)
    _quiet_dask()
    try:
        from prefect_dask.task_runners import DaskTaskRunner
    except ImportError:
        raise InputError(
            "--task-runner dask needs prefect-dask: pip install 'embedline[dask]'"
        ) from None
    _quiet_scheduler_loss()
    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    if settings.dask_cluster_class:
        from flows.dask_cluster import cluster_class

        return DaskTaskRunner(
            cluster_class=cluster_class(settings.dask_cluster_class),
            cluster_kwargs=dict(settings.dask_cluster_kwargs or {}),
        )
    _no_worker_profiler()
    _close_clusters_quietly_at_exit()
    STOP.on_first_interrupt(_silence_dask)
    if settings.embedder == "local":  # CPU-bound: the machine's cores, not the API, limit it
        threads = max(1, -(-window // settings.dask_workers))
    else:
        threads = settings.concurrency + 1
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": settings.dask_workers,
            "threads_per_worker": threads,
            "processes": True,
            # the scheduler serves HTTP even without a dashboard, by default on port 8787:
            # a second cluster on the machine warned "Port 8787 is already in use"
            "dashboard_address": "127.0.0.1:0",
        }
    )


def warm_up(
    runner: Any, settings: RunSettings, logger: Any, *, since: float, work_left: bool = True
) -> str | None:
    """Dask: on every worker, before the first chunk, stop the statistical profiler
    (``flows.dask_workers.NoProfiler``, also on workers that join later), hold ``--rpm``/
    ``--tpm`` once for the whole cluster (``tasks.embed.cluster_budget``, on the scheduler),
    check that the worker's environment holds what the run's chunks need, and import the
    chunk task's modules (start-up, not embedding); log how long the task runner took to be ready
    (``since``: a ``time.monotonic()`` before the cluster started).

    :returns: one line naming a worker and the setting it lacks, or saying that the
        cluster by address has no worker after ``WORKER_WAIT_S`` while ``work_left`` (the
        run stops before any chunk), or None.
    """
    if settings.task_runner != "dask":
        return None
    from flows.dask_workers import NoProfiler, missing_settings, worker_needs

    client = runner.client
    if settings.dask_address and work_left and not _first_worker(client):
        return (
            f"the Dask scheduler at {settings.dask_address} has no workers (waited "
            f"{worker_wait_s():g} s): start workers with `dask worker {settings.dask_address}`, "
            "then rerun"
        )
    try:
        client.register_plugin(NoProfiler())
        if settings.rpm is not None or settings.tpm is not None:
            from tasks.embed.cluster_budget import install_budget, ship_by_value

            ship_by_value()
            client.run_on_scheduler(install_budget)
        needs = worker_needs(settings, dict(os.environ))
        lacking = {a: m for a, m in client.run(missing_settings, needs).items() if m}
        if lacking:
            return _lacking_line(lacking, client)
        workers = client.run(warm_worker)
    except Exception as exc:
        if "No module named" not in str(exc):
            raise
        return (
            f"a Dask worker cannot load embedline's code ({_first_line(exc)}): install the "
            "same embedline on every worker (docs/guide/cluster.md), then rerun"
        )
    logger.info(
        "task runner ready: dask, %d workers, in %.1f s (cluster start and warm-up)",
        len(workers),
        time.monotonic() - since,
    )
    return None


def in_flight(runner: Any, settings: RunSettings, window: int) -> int:
    """The chunk task runs to keep in flight (the dispatcher's window): ``window`` with
    threads; on Dask, the cluster's worker threads (``Client.nthreads()``, read from the
    scheduler after ``warm_up``): none waits in a busy worker's queue while another
    worker's thread is free; ``window`` if the cluster has no worker yet (an adaptive one)
    (docs/guide/cluster.md, "Sizing workers and concurrency")."""
    if settings.task_runner != "dask":
        return window
    threads: dict[str, int] = runner.client.nthreads()  # worker address -> its threads
    return sum(threads.values()) or window  # no worker yet (an adaptive cluster): ``window``


def _first_line(exc: BaseException) -> str:
    """The error's own words, one line: Dask wraps a worker's as ``Exception("Error(...)")``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    wrapped = re.fullmatch(r"\w+\((['\"])(.*)\1\)", text)
    return wrapped.group(2).replace("\\'", "'") if wrapped else text


def has_workers(runner: Any) -> bool:
    """Whether the task runner can run a task now: threads always; Dask with a worker."""
    client = getattr(runner, "client", None)
    return client is None or bool(cluster_workers(client))


def _first_worker(client: Any) -> bool:
    """Whether the cluster has a worker, waiting up to ``worker_wait_s()`` for one: every
    chunk task (and the cached task runs shown for published chunks) would wait for one
    forever, the run saying nothing."""
    if cluster_workers(client):
        return True
    try:
        client.wait_for_workers(1, timeout=worker_wait_s())
    except TimeoutError:
        return False
    return True


def worker_wait_s() -> float:
    """``WORKER_WAIT_S``, or ``EMBEDLINE_DASK_WORKER_WAIT_S`` when set to a number > 0."""
    try:
        value = float(os.environ.get("EMBEDLINE_DASK_WORKER_WAIT_S", "") or WORKER_WAIT_S)
    except ValueError:
        return WORKER_WAIT_S
    return value if value > 0 else WORKER_WAIT_S


def _lacking_line(lacking: dict[str, list[str]], client: Any) -> str:
    """One line for the workers that lack settings: the first (by address), its name when
    it has one, what it lacks, and how many other workers lack something."""
    from flows.dask_workers import INPUT_FILE_NEED

    address = sorted(lacking)[0]
    name = (cluster_workers(client) or {}).get(address, {}).get("name")
    worker = f"{address} ({name})" if name not in (None, "", address) else address
    others = len(lacking) - 1
    more = f" (and {others} other worker{'s' if others > 1 else ''})" if others else ""
    files = [
        n.removeprefix(INPUT_FILE_NEED) for n in lacking[address] if n.startswith(INPUT_FILE_NEED)
    ]
    if files:
        return (
            f"Dask worker {worker}{more} cannot read the input {files[0]!r}, a file of this "
            "machine: its chunk tasks read their own bytes of it. Give an s3:// input (or the "
            "same path on a filesystem every worker mounts), then rerun"
        )
    return (
        f"Dask worker {worker}{more} has no {' and no '.join(lacking[address])} in its "
        "environment: set it where the worker starts, then rerun"
    )


def _quiet_dask() -> None:
    """Dask's own INFO lines (34 in a run: "Scheduler at …", "Closing Nanny …", "Remove
    worker …") say nothing an operator acts on; keep its warnings and errors. ``--debug``
    (or the variable set by the user) keeps them all."""
    if not os.environ.get(DEBUG_ENV):
        os.environ.setdefault(_DASK_LOG_LEVEL_ENV, "warning")
        _quiet_resource_tracker()
    if os.environ.get(_DASK_LOG_LEVEL_ENV) == "warning":  # dask imported earlier: this process
        logging.getLogger("distributed").setLevel(logging.WARNING)


def _quiet_scheduler_loss() -> None:
    """A lost scheduler makes this process's Dask client log its failed reconnects at ERROR
    with a ``CommClosedError`` traceback, beside the one line the run ends with (its chunks
    fail with ``WorkerLostError``); drop those records as the workers do
    (``flows.dask_logging.SchedulerGoneFilter``), unless ``--debug``."""
    if os.environ.get(DEBUG_ENV):
        return
    from flows.dask_logging import SchedulerGoneFilter

    # a filter of the logger itself: its records also reach Prefect's handlers on the root
    client = logging.getLogger("distributed.client")
    if not any(isinstance(f, SchedulerGoneFilter) for f in client.filters):
        client.addFilter(SchedulerGoneFilter())


#: A ``-W`` option for multiprocessing's resource tracker (see ``_quiet_resource_tracker``).
_RESOURCE_TRACKER_WARNINGS = "ignore:resource_tracker:UserWarning"


def _quiet_resource_tracker() -> None:
    """A Ctrl-C as the local cluster starts leaves the nannies' semaphores to
    multiprocessing's resource tracker, which removes them and then warns, after the
    command's last line: "resource_tracker: There appear to be 12 leaked semaphore objects
    to clean up at shutdown". The tracker is a process of its own, started with this
    process's ``-W`` options (``sys.warnoptions``, CPython's
    ``subprocess._args_from_interpreter_flags``): add one that ignores that warning, before
    the cluster starts it."""
    if _RESOURCE_TRACKER_WARNINGS not in sys.warnoptions:
        sys.warnoptions.append(_RESOURCE_TRACKER_WARNINGS)


def _no_worker_profiler() -> None:
    """Turn off the statistical profiler of the local cluster's workers, and have them import
    ``flows.dask_preload`` as they start (no traceback from a worker whose scheduler closed).

    The profiler calls ``sys._current_frames()`` every 10 ms, which on CPython 3.11 can
    deadlock a worker whose threads allocate (a GC inside the call; CPython
    gh-106883/gh-116969, dask/distributed#8616): measured here, a 20,000-row run hung with
    every worker thread waiting on a lock. The nanny passes this process's Dask config to the
    workers it spawns.
    """
    import dask.config

    preload = [*dask.config.get("distributed.worker.preload", []), "flows.dask_preload"]
    dask.config.set(
        {
            "distributed.worker.profile.enabled": False,
            "distributed.worker.preload": list(dict.fromkeys(preload)),
        }
    )


def _close_clusters_quietly_at_exit() -> None:
    """Replace distributed's exit handler (``distributed.deploy.spec.close_clusters``) by one
    that cannot print a traceback. A Ctrl-C while the local cluster starts leaves it half
    started, and that handler then prints "Exception ignored in atexit callback" with an
    ``AssertionError: Status.running`` from its own teardown after the one-line message.
    Its worker processes exit with this process either way (distributed's worker processes
    watch their parent: ``test_kill_9_of_a_dask_run_leaves_no_server_and_no_worker``)."""
    import atexit

    from distributed.deploy import spec

    atexit.unregister(spec.close_clusters)
    atexit.unregister(_close_clusters)
    atexit.register(_close_clusters)


def _silence_dask() -> None:
    """A Ctrl-C as the local cluster starts cuts its start short; what its teardown then logs
    in this process ("exit status was already read", asyncio's "Task exception was never
    retrieved … Nanny failed to start") tells the user nothing the CLI's one line does not.
    Kept with ``--debug``."""
    if not os.environ.get(DEBUG_ENV):
        for name in ("distributed", "asyncio"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _close_clusters() -> None:
    """At exit, after the command's last line: a cluster still open here was cut short."""
    from distributed.deploy import spec

    _silence_dask()
    try:
        spec.close_clusters()
    except Exception:  # noqa: BLE001 (at exit, after the command's own output)
        _log.debug("closing the local Dask cluster at exit failed", exc_info=True)
