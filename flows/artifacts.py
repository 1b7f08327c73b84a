"""What the Prefect UI shows: a progress artifact while chunks finish, a summary at the end.

Artifacts carry counts, ids, reasons and URIs only: never input text, never secrets.
Keys are stable (``embedline-progress``, ``embedline-summary``, ``embedline-dead-letters``)
so the Artifacts page keeps one history per key (Prefect docs: artifacts, "key").
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import httpx
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.exceptions import PrefectException

from embedline.models import DeadLetter, LoadSummary, RunSummary, run_cost
from embedline.shutdown import STOP

__all__ = [
    "ProgressArtifact",
    "load_markdown",
    "publish_load_summary",
    "publish_summary",
    "summary_markdown",
]

_MAX_DEAD_LETTERS_SHOWN = 1000
#: Posts of the progress artifact that may fail in a row before posting stops for the run.
_MAX_FAILED_POSTS = 3
logger = logging.getLogger("embedline.report")


class ProgressArtifact:
    """A progress artifact (0–100 %), posted by a thread of its own at most every
    ``min_interval_s`` seconds.

    The caller (the dispatcher, which records chunks in the ledger) never waits for the API:
    a call to a server that went away is retried by Prefect's client for about a minute
    (``PREFECT_CLIENT_MAX_RETRIES`` = 5, sleeping 2, 4, 8, 16, 32 s). Posting stops for good
    once the API is lost (``STOP.report.api_lost``) or three posts in a row fail; a failed
    post (a busy server's 500, which the client does not retry) is tried again with the
    next value, and the last value once more at ``close``.
    """

    def __init__(self, *, description: str, min_interval_s: float = 1.0) -> None:
        # sync_compatible: a sync caller gets the UUID, not a coroutine
        self._id: UUID = create_progress_artifact(  # type: ignore[assignment]
            progress=0.0, key="embedline-progress", description=description
        )
        self._min_interval_s = min_interval_s
        self._latest: float | None = None
        self._closed = threading.Event()
        self._wake = threading.Event()
        context = contextvars.copy_context()  # Prefect's settings and client context
        self._thread = threading.Thread(
            target=context.run,
            args=(self._post_loop,),
            name="embedline-progress-artifact",
            daemon=True,
        )
        self._thread.start()

    def update(self, done: int, total: int) -> None:
        """Set progress to ``done / total`` (rows or chunks); returns at once."""
        self._latest = 100.0 * done / total if total else 100.0
        self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Post the last value (waiting at most ``timeout_s`` seconds) and stop; with the
        API lost, stop at once (a call in progress is left to its retries), also when the
        loss is found while waiting (waiting out the timeout would hold the commit 5 s)."""
        self._closed.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and STOP.report.api_lost() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._thread.join(min(left, 0.1))

    def _post_loop(self) -> None:
        posted = None
        failures = 0  # in a row: a busy server's 5xx is worth another try, a dead one is not
        while True:
            self._wake.wait()
            self._wake.clear()
            if STOP.report.api_lost() is not None:
                return
            value = self._latest
            if value is not None and value != posted:
                try:
                    update_progress_artifact(self._id, value)
                except (httpx.HTTPError, PrefectException) as exc:
                    failures += 1
                    logger.debug("progress artifact not updated (%d): %s", failures, exc)
                    if failures >= _MAX_FAILED_POSTS:
                        return
                else:
                    posted, failures = value, 0
            if self._closed.is_set():
                if value == posted or failures >= _MAX_FAILED_POSTS:
                    return
                self._wake.set()  # one more try at the last value before close() gives up
                time.sleep(0.2)
                continue
            self._closed.wait(self._min_interval_s)  # close() ends the pause: its join waits
            # for one last post, not for the rest of a second


def summary_markdown(
    summary: RunSummary,
    *,
    dead_letters: Sequence[DeadLetter] = (),
    chunk_states: dict[str, int] | None = None,
    price_per_million_tokens: float | None = None,
) -> str:
    """Render the run summary as Markdown (no text, no secrets)."""
    price = price_per_million_tokens
    spent, batch_saved = run_cost(summary.tokens, summary.batch_tokens, price or 0.0)
    cost = (
        f"${spent:,.4f} (at ${price}/1M tokens"
        + (
            f"; {summary.batch_tokens:,} tokens at the batch price, ${price / 2}/1M)"
            if summary.batch_tokens
            else ")"
        )
        if price is not None
        else "n/a (no price given)"
    )
    saved = (
        f"~${summary.tokens_saved * price / 1e6:,.4f} (~{summary.tokens_saved:,} tokens "
        "not sent, estimated)"
        if price is not None
        else f"~{summary.tokens_saved:,} tokens not sent (estimated)"
    )
    rows = [
        ("status", f"**{summary.status}**" + (f": {summary.message}" if summary.message else "")),
        ("run key", f"`{summary.run_key}`"),
        ("rows published", f"{summary.rows_published:,} of {summary.rows_total:,}"),
        ("rows already published before this run", f"{summary.rows_skipped:,}"),
        ("rows published meanwhile by a concurrent run", f"{summary.rows_concurrent:,}"),
        (
            "dead letters",
            f"{summary.rows_failed:,}"
            + (f" ({summary.rows_empty:,} empty texts, skipped)" if summary.rows_empty else ""),
        ),
        (
            "chunks",
            f"{summary.chunks_published} published now, {summary.chunks_skipped} "
            f"skipped, {summary.chunks_failed} failed, {summary.chunks_released} "
            f"released, {summary.chunks_not_run} not run, of {summary.chunks_total}",
        ),
        (
            "chunks by ledger state",
            ", ".join(f"{k} {v}" for k, v in sorted((chunk_states or {}).items())) or "-",
        ),
        ("tokens (reported by the API)", f"{summary.tokens:,}"),
        (
            "texts sent",
            f"{summary.inputs:,}"
            + (
                f" ({summary.batch_inputs:,} of them in Batch API batches)"
                if summary.batch_inputs
                else ""
            ),
        ),
        ("rows reused from earlier runs", f"{summary.rows_reused:,}"),
        ("rows deduplicated in this run", f"{summary.rows_deduplicated:,}"),
        ("estimated cost", cost),
        ("saved by reuse and deduplication", saved),
        *(
            [
                (
                    "saved by the Batch API (half price)",
                    f"${batch_saved:,.4f} on {summary.batch_tokens:,} tokens"
                    if price is not None
                    else f"half the price of {summary.batch_tokens:,} tokens",
                )
            ]
            if summary.batch_tokens
            else []
        ),
        ("requests", f"{summary.requests:,}"),
        (
            "wall time",
            f"{summary.wall_s:.1f} s"
            + (" (the run; the load below has its own)" if summary.load else ""),
        ),
        ("output", f"`{summary.output}`"),
        ("manifest", f"`{summary.manifest_uri}`" if summary.manifest_uri else "not committed"),
        ("changes", _changes_cell(summary)),
    ]
    lines = ["# embedline run", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    if summary.exit_code != 0 and summary.run_key:
        lines += [
            "",
            "Rerun only what is missing: run the deployment again with the same "
            "parameters, press **Retry** on this flow run, or `embedline run` the same "
            f"command (`embedline status {summary.run_key[:12]}`).",
        ]
    if summary.load:  # run --sink: the load stage's own lines
        load = LoadSummary(**summary.load)  # type: ignore[arg-type]  # a LoadSummary.to_dict()
        lines += ["", "## Load into the sink", "", "| | |", "|---|---|", *_load_lines(load)]
    if dead_letters:
        lines += [
            "",
            f"## Dead letters ({len(dead_letters)})",
            "",
            "| row | id | reason | HTTP |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {d.row_number} | `{_cell(d.id)}` | {d.reason} | {d.http_status or ''} |"
            for d in dead_letters[:_MAX_DEAD_LETTERS_SHOWN]
        ]
    return "\n".join(lines) + "\n"


def _changes_cell(summary: RunSummary) -> str:
    if summary.rows_added is None:
        return "none (no manifest committed)"
    base = (
        f"against run `{summary.changes_base[:12]}`"
        if summary.changes_base
        else "first run of this dataset on this output"
    )
    return (
        f"{summary.rows_added:,} added, {summary.rows_changed:,} changed, "
        f"{summary.rows_removed:,} removed, {summary.rows_unchanged:,} unchanged ({base}): "
        f"`{summary.changes_object}`"
    )


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("`", "'").replace("\n", " ")[:200]


def publish_summary(
    summary: RunSummary,
    *,
    dead_letters: Sequence[DeadLetter] = (),
    chunk_states: dict[str, int] | None = None,
    price_per_million_tokens: float | None = None,
) -> None:
    """Create the ``embedline-summary`` (and, with dead letters, a table) artifact."""
    create_markdown_artifact(
        summary_markdown(
            summary,
            dead_letters=dead_letters,
            chunk_states=chunk_states,
            price_per_million_tokens=price_per_million_tokens,
        ),
        key="embedline-summary",
        description=f"embedline run {summary.status}",
    )
    if dead_letters:
        table: list[dict[str, Any]] = [
            {"row": d.row_number, "id": d.id, "reason": d.reason, "http_status": d.http_status}
            for d in dead_letters[:_MAX_DEAD_LETTERS_SHOWN]
        ]
        create_table_artifact(
            table,
            key="embedline-dead-letters",
            description=f"{len(dead_letters)} dead letters (no text)",
        )


def load_markdown(summary: LoadSummary) -> str:
    """Render a load's summary as Markdown (counts only; a refusal's message names the
    counts and the flag that allows it)."""
    return "\n".join(["# embedline load", "", "| | |", "|---|---|", *_load_lines(summary)]) + "\n"


def _load_lines(summary: LoadSummary) -> list[str]:
    """The load's table rows: status, sink, run, mode, rows, chunks, index, wall time."""
    rows = [
        ("status", f"**{summary.status}**" + (f": {summary.message}" if summary.message else "")),
        ("sink", f"`{summary.sink}`"),
        ("run key", f"`{summary.run_key}`"),
        ("mode", summary.mode or "-"),
        (
            "rows",
            f"{summary.rows_loaded:,} upserted now, {summary.rows_skipped:,} held before, "
            f"{summary.rows_deleted:,} deleted",
        ),
        (
            "chunks",
            f"{summary.chunks_loaded} loaded now, {summary.chunks_skipped} skipped, "
            f"{summary.chunks_failed} failed, of {summary.chunks_total}",
        ),
        (
            "index",
            "-"
            if not summary.index_state
            else summary.index_state  # deferred: nothing built, no seconds to give
            if summary.index_state.startswith("deferred")
            else f"{summary.index_state} in {summary.index_s:.1f} s",
        ),
        ("wall time", f"{summary.wall_s:.1f} s (the load, index included)"),
    ]
    cells = [value.replace("|", "\\|").replace("\n", " ") for _, value in rows]
    return [f"| {n} | {c} |" for (n, _), c in zip(rows, cells, strict=True)]


def publish_load_summary(summary: LoadSummary) -> None:
    """Create the ``embedline-load-summary`` artifact of a ``load-run`` flow run."""
    create_markdown_artifact(
        load_markdown(summary),
        key="embedline-load-summary",
        description=f"embedline load {summary.status}",
    )
