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
from embedline.summary import saved_phrase

__all__ = ["ProgressBar", "command_seconds", "cost_lines", "print_summary", "stop_progress"]


def command_seconds() -> float:
    """Seconds since this command started (``cli.started.STARTED_AT``)."""
    from cli.started import STARTED_AT

    return time.monotonic() - STARTED_AT


_active: list[ProgressBar] = []  # the bar of the run in progress, for stop_progress


class ProgressBar:
    """Run progress on stderr, fed by ``embedline.progress`` events (rows, chunks, rows/s,
    ETA), per batch when chunk tasks run in this process; in Batch API mode, while the run
    waits for its batches, also the batches by status with their requests done.

    On a terminal (``terminal``): a live bar; Prefect's log lines are printed above it, not
    glued onto it. Otherwise (a file, a pipe, CI): one line every ``interval_s`` seconds,
    ``embedline: progress 12,000 of 63,905 rows (18.8%), 3 of 64 chunks, 5,210 rows/s,
    ETA 10 s`` (0 disables them).
    """

    def __init__(self, *, terminal: bool, interval_s: float = 10.0) -> None:
        self.terminal = terminal
        self.interval_s = interval_s
        self._bar: Progress | None = None
        self._task: Any = None
        self._started: float | None = None
        self._skipped = 0
        self._last_line = 0.0
        self._swapped: list[tuple[Any, Any]] = []

    def __enter__(self) -> ProgressBar:
        if self.terminal:
            self._bar = Progress(
                TextColumn("[bold]embedding"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(
                    "rows · {task.fields[chunks]} chunks · {task.fields[rate]} rows/s"
                    "{task.fields[batches]}"
                ),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=sys.stderr),
                transient=False,
            )
            self._bar.start()
            self._logs_above(self._bar.console)
            progress.listen(self._update_bar)
        elif self.interval_s > 0:
            progress.listen(self._print_line)
        _active.append(self)
        return self

    def _logs_above(self, console: Console) -> None:
        """Print Prefect's console log lines through the bar's console (above the bar)."""
        import logging

        for logger in (logging.getLogger(), logging.getLogger("prefect")):
            for handler in logger.handlers:
                if isinstance(getattr(handler, "console", None), Console):
                    # rich's handler (checked by the getattr above): `console` is its own
                    self._swapped.append((handler, handler.console))  # type: ignore[attr-defined]
                    handler.console = console  # type: ignore[attr-defined]

    def _rate(self, event: progress.Progress) -> float:
        now = time.monotonic()
        if self._started is None:
            self._started, self._skipped = now, event.rows_skipped
        return (event.rows_done - self._skipped) / max(now - self._started, 1e-6)

    def _update_bar(self, event: progress.Progress) -> None:
        assert self._bar is not None
        rate = self._rate(event)
        if self._task is None:
            self._task = self._bar.add_task(
                "run", total=event.rows_total, chunks="", rate="-", batches=""
            )
        batches = progress.batches_phrase(event.batches)
        self._bar.update(
            self._task,
            completed=event.rows_done,
            chunks=f"{event.chunks_done}/{event.chunks_total}",
            rate=f"{rate:,.0f}",
            batches=f" · {batches}" if batches else "",
        )

    def _print_line(self, event: progress.Progress) -> None:
        rate = self._rate(event)
        now = time.monotonic()
        if now - self._last_line < self.interval_s:
            return
        self._last_line = now
        sys.stderr.write(progress_line(event, rate) + "\n")
        sys.stderr.flush()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self not in _active:
            return  # stopped already (stop_progress)
        _active.remove(self)
        progress.listen(None)
        for handler, console in self._swapped:
            handler.console = console
        if self._bar is not None:
            self._bar.stop()


def stop_progress() -> None:
    """Stop the bar of the run in progress (restoring the terminal's cursor and Prefect's
    log consoles) before a summary printed from another thread, or a hard exit."""
    for bar in list(_active):
        bar.__exit__(None, None, None)


def progress_line(event: progress.Progress, rate: float) -> str:
    """One progress line: rows and chunks done of the totals, rows/s, ETA (seconds); while
    the run waits for Batch API batches, the batches by status with their requests done
    (``; batches 3 in_progress (1,200 of 4,000 requests done)``)."""
    share = 100.0 * event.rows_done / event.rows_total if event.rows_total else 100.0
    left = event.rows_total - event.rows_done
    eta = f"{left / rate:,.0f} s" if rate > 0 else "-"
    batches = progress.batches_phrase(event.batches)
    return (
        f"embedline: progress {event.rows_done:,} of {event.rows_total:,} rows "
        f"({share:.1f}%), {event.chunks_done} of {event.chunks_total} chunks, "
        f"{rate:,.0f} rows/s, ETA {eta}" + (f"; {batches}" if batches else "")
    )


def cost_lines(summary: dict[str, Any]) -> list[str]:
    """The cost line, when the run had a ``price_per_million_tokens`` (USD); in Batch API
    mode also the batches and what their half price saved."""
    price = summary.get("price_per_million_tokens")
    batch_tokens = int(summary.get("batch_tokens") or 0)
    count = int(summary.get("batches") or 0)
    batches = (
        f"batch      {plural(count, 'Batch API batch', 'Batch API batches')}, "
        f"{batch_tokens:,} tokens at the batch price (half)"
    )
    if price is None:
        return [batches] if batch_tokens or summary.get("batches") else []
    from embedline.summary import run_cost

    spent, batch_saved = run_cost(summary["tokens"], batch_tokens, price)
    lines = [f"cost       ${spent:,.4f} estimated (at ${price}/1M tokens)"]
    if batch_tokens:
        lines.append(f"{batches}: ${batch_saved:,.4f} saved by --batch-api")
    elif summary.get("batches"):  # submitted, nothing collected yet (an interrupted wait)
        lines.append(batches)
    return lines


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 request``, ``2 requests`` (thousands grouped); ``words``: the plural where it is
    not ``word`` + s (``batch``, ``batches``)."""
    return f"{count:,} " + (word if count == 1 else words or f"{word}s")


def _api_line(summary: dict[str, Any]) -> str:
    """What the embedder was asked: HTTP requests (those that got no vectors: rate limited,
    a server error, a timeout, a refusal such as a 401; their texts not charged), the texts
    charged (answered with vectors; in Batch API mode, how many of them batches answered),
    tokens; an in-process model (no requests) embedded its inputs locally; a run committed
    before embedded nothing."""
    requests, inputs = summary["requests"], summary.get("inputs", 0)
    batch_inputs = int(summary.get("batch_inputs") or 0)
    retried = int(summary.get("requests_retried") or 0)  # got no vectors: not charged
    unpaid = plural(int(summary.get("inputs_retried") or 0), "text")
    if summary.get("status") == "already_complete" and not requests + inputs:
        return "embedder   nothing embedded: the run was committed before"  # any embedder
    if requests == 0 and inputs and not batch_inputs:
        return f"model      {plural(inputs, 'input')} embedded in-process (no API requests)"
    return (
        f"api        {plural(requests, 'request')}"
        + (f" ({retried:,} without vectors: {unpaid} not charged)" if retried else "")
        + f", {plural(inputs, 'input')} charged"
        + (f" ({batch_inputs:,} of them in Batch API batches)" if batch_inputs else "")
        + f", {plural(summary['tokens'], 'token')} reported"
    )


def _chunks_line(summary: dict[str, Any]) -> str:
    """The chunks published, skipped, failed and not run; a run with no chunk to write (a
    delta night that only removes rows, an input of empty texts) says so instead of "of 0"."""
    if not summary["chunks_total"]:
        return "chunks     none to write"
    return (
        f"chunks     {summary['chunks_published']} published now, "
        f"{summary['chunks_skipped']} skipped, "
        + (
            f"{summary['chunks_concurrent']} by a concurrent run, "
            if summary.get("chunks_concurrent")
            else ""
        )
        + f"{summary['chunks_failed']} failed, "
        + (f"{summary['chunks_released']} released, " if summary.get("chunks_released") else "")
        + f"{summary['chunks_not_run']} not run, of {summary['chunks_total']}"
    )


def _reuse_line(summary: dict[str, Any]) -> str:
    """Rows reused and deduplicated, and what that saved (``saved_phrase``)."""
    reused, deduplicated = summary.get("rows_reused", 0), summary.get("rows_deduplicated", 0)
    line = (
        f"reuse      {reused:,} rows reused from earlier runs, {deduplicated:,} deduplicated "
        "in this run"
    )
    if not reused + deduplicated:
        return line
    return (
        line
        + "; saved "
        + saved_phrase(
            rows=reused + deduplicated,
            tokens_saved=int(summary.get("tokens_saved") or 0),
            measured=bool(summary.get("tokens_saved_measured")),
            price=summary.get("price_per_million_tokens"),
        )
    )


def print_summary(summary: dict[str, Any], *, command_s: float | None = None) -> None:
    """Print the run summary (counts, wall time, manifest) to stdout; never any text.

    ``wall_s`` is the run's own time (the flow's, or the CLI's commit without Prefect);
    ``command_s``, when given, is the whole command's, Prefect's start-up included, in
    seconds since the process started."""
    lines = [
        f"run        {summary.get('run_key') or '-'}"
        + (
            f" (generation {summary['generation']}: commits run "
            f"{str(summary['supersedes'])[:12]}'s input again)"
            if summary.get("supersedes")
            else ""
        ),
        f"status     {summary['status']}"
        + (f": {summary['message']}" if summary["message"] else ""),
    ]
    if summary.get("run_key"):
        lines += [
            f"rows       {summary['rows_published']:,} published of {summary['rows_total']:,} "
            f"({summary['rows_skipped']:,} already published before"
            + (
                f", {summary['rows_concurrent']:,} by a concurrent run"
                if summary.get("rows_concurrent")
                else ""
            )
            + "), "
            + plural(summary["rows_failed"], "dead letter")
            + (
                f" ({plural(summary['rows_empty'], 'empty text')}, skipped)"
                if summary.get("rows_empty")
                else ""
            ),
            _chunks_line(summary),
            _api_line(summary),
            _reuse_line(summary),
            *cost_lines(summary),
            f"wall time  {summary['wall_s']:.1f} s"
            + (
                f" (the whole command: {command_s:.1f} s, with Prefect's start-up"
                + (" and the load below)" if summary.get("load") else ")")
                if command_s is not None and command_s - summary["wall_s"] >= 0.1
                else ""
            ),
            f"output     {summary['output']}",
        ]
    if summary.get("delta_base"):
        inherited = summary.get("rows_inherited", 0)
        written = summary["rows_published"] - inherited
        kept = f"{inherited:,} kept in the objects of" if inherited else "none kept from"
        lines.append(
            f"delta      {written:,} rows written, {kept} run {summary['delta_base'][:12]} "
            "(a delta night)"
        )
    if summary.get("rows_added") is not None:
        base = summary.get("changes_base")
        lines.append(
            f"changes    {summary['rows_added']:,} added, {summary['rows_changed']:,} changed, "
            f"{summary['rows_removed']:,} removed, {summary['rows_unchanged']:,} unchanged "
            + (f"(against run {base[:12]}" if base else "(first run of this dataset on this output")
            + ("; as committed earlier)" if summary["status"] == "already_complete" else ")")
        )
    if summary.get("manifest_uri"):
        lines.append(f"manifest   {summary['manifest_uri']}")
    print("\n".join(lines))
