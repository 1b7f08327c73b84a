"""What the Batch API stage (``flows.batch_stage``) tells the user while it waits and when it
stops: the run's batches by status after every poll (the progress bar or lines, and one
INFO line when they change), and the batches a run leaves running at the provider (its
final message and last line say how many and both ways on)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from adapters.ledger import BatchRecord
from embedline.progress import BatchCount
from embedline.shutdown import STOP
from flows.signals import under_prefect_runner
from tasks.batch.calls import Log
from tasks.batch.records import batch_counts, left_running_note, running_batches, unconfirmed

__all__ = ["BatchProgress", "note_left_running"]


class BatchProgress:
    """The run's batches by status, with their requests and how many are done: to
    ``on_progress`` after every poll, and one INFO line to ``log`` when they change."""

    def __init__(
        self, log: Log, on_progress: Callable[[tuple[BatchCount, ...]], None] | None
    ) -> None:
        self.log, self.on_progress = log, on_progress
        self._shown: tuple[BatchCount, ...] = ()

    def show(self, records: list[BatchRecord], chunks: Collection[int]) -> None:
        """Report ``records`` of the stage's ``chunks``."""
        counts = batch_counts(r for r in records if r.idx in chunks)
        if self.on_progress is not None:
            self.on_progress(counts)
        if counts != self._shown:
            self._shown = counts
            self.log.info(
                "batches: %s; %d of %d requests done",
                ", ".join(f"{c.batches} {c.status}" for c in counts),
                sum(c.completed for c in counts),
                sum(c.requests for c in counts),
            )


def note_left_running(
    records: list[BatchRecord], sent: Collection[tuple[int, int]], run_key: str, log: Log
) -> None:
    """Note (``STOP.report.note_left_running``) and log the batches the run leaves running at
    the provider, if any: those submitted that have not ended, and parts whose create
    was sent (``sent``: chunk and part) but never confirmed (they may run)."""
    what = left_running_note(
        len(running_batches(records)),
        len(unconfirmed(records, sent)),
        run_key,
        rerun=("a new run with the same parameters (or a Retry) collects them")
        if under_prefect_runner()
        else "rerun the same command to collect them",
    )
    if what is not None:
        log.warning("the run stops: %s", what)
        STOP.report.note_left_running(what)  # the run's final message and last line say it
