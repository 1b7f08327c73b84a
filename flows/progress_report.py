"""The progress feed of a run: the CLI's bar or lines and the Prefect progress artifact,
fed from the dispatcher's results with the same numbers (DESIGN §7, "Progress")."""

from __future__ import annotations

from typing import Any

from embedline.models import ChunkOutcome, InputPlan
from embedline.progress import Progress, notify, partial_rows
from flows.dispatch import DispatchResult
from tasks.report import ProgressArtifact

__all__ = ["progress_reporter"]


def progress_reporter(
    plan: InputPlan, skipped: dict[int, ChunkOutcome], artifact: ProgressArtifact
) -> Any:
    """Progress per dispatcher event: rows of published chunks plus the batches running
    chunks embedded so far. Never less than an earlier report: the batches of a chunk that
    Prefect retries, fails or releases drop out of the count, and a progress line that went
    back read as lost work. The count moves again once the work since passes it; it never
    passes the total."""
    rows_skipped = sum(c.rows for c in plan.chunks if c.index in skipped)
    shown = [0]  # the highest rows_done reported

    def report(result: DispatchResult) -> None:
        finished = {*result.published, *result.published_elsewhere, *result.failed,
                    *result.released}
        done = {*result.published, *result.published_elsewhere}
        rows_done = (rows_skipped + sum(plan.chunks[i].rows for i in done)
                     + partial_rows(finished))  # batches of running chunks (this process)
        rows_done = shown[0] = max(shown[0], rows_done)
        chunks_done = len(skipped) + len(done)
        notify(Progress(
            rows_total=plan.rows, chunks_total=len(plan.chunks), rows_done=rows_done,
            chunks_done=chunks_done, rows_skipped=rows_skipped,
            dead_letters=sum(len(o.dead_letters) for o in result.published.values()),
            chunks_failed=len(result.failed),
        ))
        artifact.update(rows_done, plan.rows)

    return report
