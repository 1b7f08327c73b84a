"""What the CLI shows a person: a progress bar while a run goes, a summary when it ends."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from embedline import progress

__all__ = ["ProgressBar", "cost_lines", "print_summary"]


class ProgressBar:
    """A terminal progress bar fed by ``embedline.progress`` events (rows, chunks, rows/s, ETA).

    Shown on stderr only when ``enabled`` (a terminal); otherwise a no-op.
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Progress | None = None
        self._task: Any = None
        self._started = 0.0
        self._skipped = 0

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self._bar = Progress(
                TextColumn("[bold]embedding"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("rows · {task.fields[chunks]} chunks · {task.fields[rate]} rows/s"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=sys.stderr),
                transient=False,
            )
            self._bar.start()
            progress.listen(self._update)
        return self

    def _update(self, event: progress.Progress) -> None:
        assert self._bar is not None
        if self._task is None:
            self._started, self._skipped = time.monotonic(), event.rows_skipped
            self._task = self._bar.add_task("run", total=event.rows_total, chunks="", rate="-")
        elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = (event.rows_done - self._skipped) / elapsed
        self._bar.update(
            self._task,
            completed=event.rows_done,
            chunks=f"{event.chunks_done}/{event.chunks_total}",
            rate=f"{rate:,.0f}",
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        progress.listen(None)
        if self._bar is not None:
            self._bar.stop()


def cost_lines(summary: dict[str, Any]) -> list[str]:
    """The cost line, when the run had a ``price_per_million_tokens`` (USD)."""
    price = summary.get("price_per_million_tokens")
    if price is None:
        return []
    spent, saved = summary["tokens"] * price / 1e6, summary.get("tokens_saved", 0) * price / 1e6
    return [f"cost       ${spent:,.4f} estimated, ~${saved:,.4f} saved by reuse and "
            f"deduplication (at ${price}/1M tokens)"]


def print_summary(summary: dict[str, Any]) -> None:
    """Print the run summary (counts, wall time, manifest) to stdout; never any text."""
    lines = [
        f"run        {summary.get('run_key') or '-'}",
        f"status     {summary['status']}" + (f": {summary['message']}" if summary["message"] else ""),
    ]
    if summary.get("run_key"):
        lines += [
            f"rows       {summary['rows_published']:,} published of {summary['rows_total']:,} "
            f"({summary['rows_skipped']:,} already published before), "
            f"{summary['rows_failed']:,} dead letters",
            f"chunks     {summary['chunks_published']} published now, "
            f"{summary['chunks_skipped']} skipped, {summary['chunks_failed']} failed, "
            f"{summary['chunks_not_run']} not run, of {summary['chunks_total']}",
            f"api        {summary['requests']:,} requests, {summary.get('inputs', 0):,} inputs "
            f"sent, {summary['tokens']:,} tokens reported",
            f"reuse      {summary.get('rows_reused', 0):,} rows reused from earlier runs, "
            f"{summary.get('rows_deduplicated', 0):,} deduplicated in this run "
            f"(~{summary.get('tokens_saved', 0):,} tokens not sent)",
            *cost_lines(summary),
            f"wall time  {summary['wall_s']:.1f} s",
            f"output     {summary['output']}",
        ]
    if summary.get("rows_added") is not None:
        base = summary.get("changes_base")
        lines.append(
            f"changes    {summary['rows_added']:,} added, {summary['rows_changed']:,} changed, "
            f"{summary['rows_removed']:,} removed, {summary['rows_unchanged']:,} unchanged "
            + (f"(against run {base[:12]})" if base else "(first run on this output)"))
    if summary.get("manifest_uri"):
        lines.append(f"manifest   {summary['manifest_uri']}")
    print("\n".join(lines))
