"""The Dask worker a chunk task runs in, when it runs in one: looked up lazily, so that a
process without ``distributed`` (the threads task runner) never imports it."""

from __future__ import annotations

from typing import Any

__all__ = ["this_worker", "worker_closing", "worker_label"]

#: Worker statuses (``distributed.core.Status`` names) of a worker shutting down.
_CLOSING = frozenset({"closing", "closed", "failed"})


def this_worker() -> Any:
    """The ``distributed.Worker`` of this process, or None (not a worker process). Outside a
    task's thread (``get_worker`` raises ``ValueError`` there), the process's running worker."""
    try:
        from distributed import Worker, get_worker
    except ImportError:
        return None
    try:
        return get_worker()
    except ValueError:
        running = [w for w in list(Worker._instances) if w.status.name == "running"]
        return running[0] if running else None


def worker_closing() -> bool:
    """Whether this runs in a Dask worker that is closing: it lost its scheduler, or is
    shut down. Closing waits for the tasks it runs only so long (``Worker.close``'s executor
    timeout, 30 s) before the process exits with whatever request is on the wire: paid, and
    never kept. A worker retiring gracefully (its scheduler alive) is not closing yet."""
    worker = this_worker()
    return worker is not None and worker.status.name in _CLOSING


def worker_label() -> str | None:
    """``Dask worker ADDRESS (NAME)`` of this process's worker, as the warm-up check names
    one (``ADDRESS`` alone when the worker was given no ``--name``); None outside a worker."""
    worker = this_worker()
    if worker is None:
        return None
    name, address = str(worker.name), str(worker.address)
    return f"Dask worker {address}" if name == address else f"Dask worker {address} ({name})"
