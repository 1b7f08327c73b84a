"""The summary of a run stopped by its ledger's full filesystem.

The ledger could not record the chunks published before it filled, so they are counted
from the store (a ``stat`` or ``HEAD`` per chunk, on this error path only), and the
requests from this process's tally (``embedline.progress``; threads runner only).
"""

from __future__ import annotations

from typing import Any

from embedline.errors import DiskFullError
from embedline.models import InputPlan
from embedline.progress import Usage, cost_in_process
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings

__all__ = ["disk_full_fields"]


def disk_full_fields(
    exc: DiskFullError, plan: InputPlan, store: ObjectStore, settings: RunSettings
) -> dict[str, Any]:
    """The ``RunSummary`` fields of a run stopped by its ledger's full filesystem: status
    ``disk_full``, exit 1, ``exc``'s one line as the message, the chunks and rows published
    (from ``store``: one HEAD or ``stat`` per planned chunk) and the requests, tokens and
    inputs sent (this process's tally; 0 on Dask)."""
    done = [c for c in plan.chunks if store.head_sha256(c.object_key) is not None]
    threads = settings.task_runner == "threads"
    usage = cost_in_process() if threads else Usage()
    return {
        "exit_code": exc.exit_code,
        "status": "disk_full",
        "message": str(exc),
        "rows_published": sum(c.rows for c in done),
        "chunks_published": len(done),
        "chunks_not_run": len(plan.chunks) - len(done),
        "requests": usage.requests,
        "tokens": usage.tokens,
        "inputs": usage.inputs,
        "requests_retried": usage.requests_retried,
        "inputs_retried": usage.inputs_retried,
    }
