"""The progress feed of a run: the CLI's bar or lines and the Prefect progress artifacts,
fed from the dispatcher's results with the same numbers (docs/reference/prefect.md, "Artifacts and
progress"), and, while the Batch API stage waits, with the run's batches by status; the
artifacts also with the requests and inputs charged so far."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from embedline.models import ChunkOutcome, InputPlan
from embedline.progress import (
    BatchCount,
    Progress,
    Usage,
    cost_in_process,
    notify,
    partial_rows,
)
from flows.artifacts import ProgressArtifact
from flows.dispatch import DispatchResult
from tasks.embed.failures import ChunkFailure

__all__ = ["ProgressReport", "progress_reporter"]


class ProgressReport:
    """Progress per dispatcher event (``__call__``): rows of published chunks plus the
    batches running chunks embedded so far. Never less than an earlier report: the batches
    of a chunk that Prefect retries, fails or releases drop out of the count, and a progress
    line that goes back reads as lost work. The count moves again once the work since passes
    it; it never passes the total. ``batches``: the Batch API batches by status while the
    batch stage waits (rows as last reported)."""

    def __init__(
        self, plan: InputPlan, skipped: dict[int, ChunkOutcome], artifact: ProgressArtifact
    ) -> None:
        self.plan, self.skipped, self.artifact = plan, skipped, artifact
        self.rows_skipped = sum(c.rows for c in plan.chunks if c.index in skipped)
        if plan.delta is not None:  # rows a delta night keeps from its base, or skips empty
            self.rows_skipped += plan.delta.rows_inherited + plan.delta.rows_empty
        self._shown = 0  # the highest rows_done reported
        self._last: Progress | None = None

    def __call__(self, result: DispatchResult) -> None:
        plan = self.plan
        finished = {
            *result.published,
            *result.published_elsewhere,
            *result.failed,
            *result.released,
        }
        done = {*result.published, *result.published_elsewhere}
        rows_done = (
            self.rows_skipped + sum(plan.chunks[i].rows for i in done) + partial_rows(finished)
        )  # batches of running chunks (this process)
        rows_done = self._shown = max(self._shown, rows_done)
        self._last = Progress(
            rows_total=plan.rows,
            chunks_total=len(plan.chunks),
            rows_done=rows_done,
            chunks_done=len(self.skipped) + len(done),
            rows_skipped=self.rows_skipped,
            dead_letters=sum(len(o.dead_letters) for o in result.published.values()),
            chunks_failed=len(result.failed),
        )
        notify(self._last)
        self.artifact.show(self._last, _usage(result))

    def batches(self, counts: Sequence[BatchCount]) -> None:
        """The run's Batch API batches by status, with the rows last reported."""
        if self._last is None:
            self(DispatchResult())
        assert self._last is not None
        event = replace(self._last, batches=tuple(counts))
        notify(event)
        self.artifact.show(event)


def _usage(result: DispatchResult) -> Usage:
    """The run's requests, tokens and inputs so far: this process's tally (chunk threads),
    else (Dask: its workers count in their own processes) what the finished chunks report."""
    tally = cost_in_process()
    if tally.requests or tally.inputs:
        return tally
    attempts: list[ChunkOutcome | ChunkFailure] = [
        *result.published.values(),
        *result.failed.values(),
        *result.released.values(),
    ]
    return Usage(
        requests=sum(o.requests for o in attempts),
        tokens=sum(o.tokens for o in attempts),
        inputs=sum(o.inputs for o in result.published.values()),
    )


def progress_reporter(
    plan: InputPlan, skipped: dict[int, ChunkOutcome], artifact: ProgressArtifact
) -> ProgressReport:
    """The run's ``ProgressReport``."""
    return ProgressReport(plan, skipped, artifact)
