"""What the progress display says while a Batch API run waits: the run's batches by status
with their request counts, in the line and in the bar; nothing about batches otherwise."""

from __future__ import annotations

from cli.console import ProgressBar, progress_line
from embedline import progress
from embedline.progress import BatchCount, Progress

WAITING = Progress(
    rows_total=12,
    chunks_total=3,
    rows_done=0,
    chunks_done=0,
    rows_skipped=0,
    dead_letters=0,
    chunks_failed=0,
    batches=(BatchCount("completed", 1, 2, 2), BatchCount("in_progress", 2, 3_000, 1_200)),
)


def test_the_progress_line_gives_batches_by_status_with_their_requests() -> None:
    assert progress_line(WAITING, 0.0) == (
        "embedline: progress 0 of 12 rows (0.0%), 0 of 3 chunks, 0 rows/s, ETA -; batches "
        "1 completed (2 of 2 requests done), 2 in_progress (1,200 of 3,000 requests done)"
    )
    no_batches = Progress(12, 3, 4, 1, 0, 0, 0)
    assert "batches" not in progress_line(no_batches, 2.0)


def test_the_bar_shows_the_batches_while_waiting_then_drops_them() -> None:
    with ProgressBar(terminal=True) as bar:
        progress.notify(WAITING)
        assert bar._bar is not None
        text = bar._bar.tasks[0].fields["batches"]
        assert text == (
            " · batches 1 completed (2 of 2 requests done), 2 in_progress "
            "(1,200 of 3,000 requests done)"
        )
        progress.notify(Progress(12, 3, 4, 1, 0, 0, 0))  # chunks running: no batch text
        assert bar._bar.tasks[0].fields["batches"] == ""
