"""What the Prefect UI shows: progress while chunks finish, a summary at the end.

Artifacts carry counts, ids, reasons and URIs only: never input text, never secrets.
Keys are stable (``embedline-progress``, ``embedline-progress-detail``, ``embedline-summary``,
``embedline-dead-letters``) so the Artifacts page keeps one history per key (Prefect docs:
artifacts, "key"). The progress artifacts are updated in place (one version per run), the
summary is created once.

Markdown renders as written in Prefect's UI (GitHub-flavoured Markdown): every plain phrase
goes through ``md_text``, which escapes what GFM would read as markup (``~`` strikes text
through, ``|`` ends a table cell, ``*``/``_`` emphasise).
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import httpx
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.exceptions import PrefectException

from embedline.models import DeadLetter
from embedline.progress import Progress, Throughput, Usage, batches_phrase, duration_phrase
from embedline.shutdown import STOP
from embedline.summary import LoadSummary, RunSummary, run_cost, saved_phrase, usd

__all__ = [
    "ProgressArtifact",
    "index_phrase",
    "load_markdown",
    "load_rows_phrase",
    "md_text",
    "progress_markdown",
    "publish_load_summary",
    "publish_summary",
    "summary_markdown",
]

_MAX_DEAD_LETTERS_SHOWN = 1000
#: Posts of the progress artifacts that may fail in a row before posting stops for the run.
_MAX_FAILED_POSTS = 3
#: Seconds between two posts of the progress artifacts (each post is two API calls).
PROGRESS_INTERVAL_S = 3.0
#: Seconds of progress the rows/s and the ETA are measured over.
RATE_WINDOW_S = 60.0
logger = logging.getLogger("embedline.report")

_GFM_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")


def md_text(text: object) -> str:
    """``text`` as literal Markdown inside a table cell: GFM's specials backslash-escaped
    (``~0.02`` would open a strikethrough), newlines as spaces."""
    return _GFM_SPECIAL.sub(r"\\\1", str(text)).replace("\r", " ").replace("\n", " ")


def _table(rows: Sequence[tuple[str, str]]) -> list[str]:
    """A two-column Markdown table of (name, cell) rows; cells are Markdown already."""
    return ["| | |", "|---|---|", *(f"| {md_text(n)} | {cell} |" for n, cell in rows)]


def progress_markdown(
    event: Progress,
    *,
    rows_per_s: float | None,
    eta_s: float | None,
    usage: Usage | None = None,
    stages: Sequence[tuple[str, str]] = (),
) -> str:
    """The ``embedline-progress-detail`` artifact: rows done of the total, rows/s over the
    last ``RATE_WINDOW_S`` seconds, ETA, chunks, requests sent and retried, inputs charged
    and tokens reported (``usage``, when known), dead letters, Batch API batches by status,
    and ``stages`` (the load into a sink and its index build: (name, phrase) each)."""
    share = 100.0 * event.rows_done / event.rows_total if event.rows_total else 100.0
    rows: list[tuple[str, str]] = [
        ("rows", md_text(f"{event.rows_done:,} of {event.rows_total:,} ({share:.1f} %)")),
        (
            "rows/s",
            md_text(
                "-" if rows_per_s is None else f"{rows_per_s:,.0f} (last {RATE_WINDOW_S:.0f} s)"
            ),
        ),
        ("ETA", md_text("done" if event.rows_done >= event.rows_total else duration_phrase(eta_s))),
        (
            "chunks",
            md_text(
                f"{event.chunks_done:,} of {event.chunks_total:,} published"
                + (f", {event.chunks_failed:,} failed" if event.chunks_failed else "")
            ),
        ),
    ]
    if event.rows_skipped:
        rows.append(("rows published before this run", md_text(f"{event.rows_skipped:,}")))
    if usage is not None:
        rows += [
            (
                "requests",
                md_text(
                    f"{usage.requests:,} sent, {usage.requests_retried:,} without vectors "
                    "(rate limited, server errors, timeouts, refusals: not charged)"
                ),
            ),
            (
                "inputs charged",
                md_text(
                    f"{usage.inputs:,} texts answered with vectors, {usage.tokens:,} tokens "
                    "reported"
                ),
            ),
        ]
    rows.append(("dead letters", md_text(f"{event.dead_letters:,}")))
    if event.batches:
        phrase = batches_phrase(event.batches).removeprefix("batches ")
        rows.append(("Batch API batches", md_text(phrase)))
    rows += [(name, md_text(phrase)) for name, phrase in stages]
    return "\n".join(["# embedline progress", "", *_table(rows)]) + "\n"


class ProgressArtifact:
    """The run's progress in Prefect's UI, posted by a thread of its own at most every
    ``min_interval_s`` seconds (a throttle: events arrive per chunk and per dispatcher tick):
    ``embedline-progress``, a progress artifact (0–100 %), and ``embedline-progress-detail``,
    a Markdown table (``progress_markdown``), both updated in place.

    The caller (the dispatcher, which records chunks in the ledger) never waits for the API:
    a call to a server that went away is retried by Prefect's client for about a minute
    (``PREFECT_CLIENT_MAX_RETRIES`` = 5, sleeping 2, 4, 8, 16, 32 s). Posting stops for good
    once the API is lost (``STOP.report.api_lost``) or three posts in a row fail; a failed
    post (a busy server's 500, which the client does not retry) is tried again with the
    next value, and the last value with backoff until ``close`` stops waiting. ``clock``:
    seconds, monotonic (rows/s and ETA), injectable for tests.
    """

    def __init__(
        self,
        *,
        description: str,
        min_interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # sync_compatible: a sync caller gets the UUID, not a coroutine
        self._id: UUID = create_progress_artifact(  # type: ignore[assignment]
            progress=0.0, key="embedline-progress", description=description
        )
        self._detail_id: UUID = create_markdown_artifact(  # type: ignore[assignment]
            "# embedline progress\n\nstarting\n",
            key="embedline-progress-detail",
            description=description,
        )
        self._min_interval_s = min_interval_s
        self._throughput = Throughput(window_s=RATE_WINDOW_S, clock=clock)
        self._lock = threading.Lock()
        self._event: Progress | None = None
        self._usage: Usage | None = None
        self._stages: dict[str, str] = {}
        self._latest: tuple[float, str] | None = None
        self._closed = threading.Event()
        self._close_deadline = 0.0  # monotonic s; set by close()
        self._wake = threading.Event()
        self._client: Any = None  # the posting thread's SyncPrefectClient, made on first post
        context = contextvars.copy_context()  # Prefect's settings and client context
        self._thread = threading.Thread(
            target=context.run,
            args=(self._post_loop,),
            name="embedline-progress-artifact",
            daemon=True,
        )
        self._thread.start()

    def update(self, done: int, total: int) -> None:
        """Set progress to ``done`` of ``total`` rows (no chunk counts); returns at once."""
        self.show(Progress(total, 0, done, 0, 0, 0, 0))

    def show(self, event: Progress, usage: Usage | None = None) -> None:
        """Show ``event`` (and the run's ``usage`` so far, when known); returns at once."""
        with self._lock:
            self._throughput.observe(event.rows_done)  # also while stalled: the rate falls
            self._event, self._usage = event, usage if usage is not None else self._usage
            self._render()

    def stage(self, name: str, phrase: str) -> None:
        """Show a stage after the chunks as its own line (``load``, ``index``): ``phrase``
        replaces the stage's earlier one; returns at once."""
        with self._lock:
            self._stages[name] = phrase
            self._render()

    def _render(self) -> None:
        event = self._event or Progress(0, 0, 0, 0, 0, 0, 0)
        value = 100.0 * event.rows_done / event.rows_total if event.rows_total else 100.0
        markdown = progress_markdown(
            event,
            rows_per_s=self._throughput.rows_per_s(),
            eta_s=self._throughput.eta_s(event.rows_total),
            usage=self._usage,
            stages=tuple(self._stages.items()),
        )
        self._latest = (value, markdown)
        self._wake.set()

    def close(self, timeout_s: float = 15.0) -> None:
        """Post the last value (waiting at most ``timeout_s`` seconds: a slow but live server
        still gets it, or a finished run would read 0 % in the UI) and stop; with the API
        lost, stop at once (a call in progress is left to its retries), also when the loss is
        found while waiting (waiting out the timeout would hold the commit)."""
        deadline = time.monotonic() + timeout_s
        self._close_deadline = deadline
        self._closed.set()
        self._wake.set()
        while self._thread.is_alive() and STOP.report.api_lost() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._thread.join(min(left, 0.1))

    def _post(self, value: float, markdown: str, posted: tuple[float, str] | None) -> None:
        """Post what changed since ``posted``: the percentage first, then the Markdown table.
        One client for the thread's life, as ``update_progress_artifact`` uses one: entering a
        new client per post checked the server's version each time, two more requests that a
        busy server made slower than ``close``'s wait for the last value."""
        if self._client is None:
            self._client = get_client(sync_client=True)
        if posted is None or value != posted[0]:
            self._client.update_artifact(self._id, ArtifactUpdate(data=value))
        if posted is None or markdown != posted[1]:
            self._client.update_artifact(self._detail_id, ArtifactUpdate(data=markdown))

    def _post_loop(self) -> None:
        posted: tuple[float, str] | None = None
        failures = 0  # in a row: a busy server's 5xx is worth another try, a dead one is not
        while True:
            self._wake.wait()
            self._wake.clear()
            if STOP.report.api_lost() is not None:
                return
            latest = self._latest
            if latest is not None and latest != posted:
                try:
                    self._post(*latest, posted)
                except (httpx.HTTPError, PrefectException) as exc:
                    failures += 1
                    logger.debug("progress artifact not updated (%d): %s", failures, exc)
                    if failures >= _MAX_FAILED_POSTS and not self._closed.is_set():
                        return
                else:
                    posted, failures = latest, 0
            if self._closed.is_set():
                # the last value, read again: one shown while this post was in flight is
                # newer than ``latest`` (a finished run read 0 % when only ``latest`` was
                # compared); it is tried until close() gives up, with backoff after a
                # failure: a busy server's 500s come in bursts three quick tries do not outlast
                pause = min(0.2 * 2 ** (failures - 1), 2.0) if failures else 0.0
                if self._latest == posted or time.monotonic() + pause > self._close_deadline:
                    return
                self._wake.set()
                time.sleep(pause)
                continue
            self._closed.wait(self._min_interval_s)  # close() ends the pause: its join waits
            # for one last post, not for the rest of the interval


def summary_markdown(
    summary: RunSummary,
    *,
    dead_letters: Sequence[DeadLetter] = (),
    chunk_states: dict[str, int] | None = None,
    price_per_million_tokens: float | None = None,
) -> str:
    """Render the run summary as Markdown (no text, no secrets); every phrase is literal
    in GFM (``md_text``), so a number never turns into a strikethrough."""
    price = price_per_million_tokens
    rows: list[tuple[str, str]] = [
        (
            "status",
            f"**{md_text(summary.status)}**"
            + (f": {md_text(summary.message)}" if summary.message else ""),
        ),
        ("run key", _code(summary.run_key)),
        ("rows published", md_text(f"{summary.rows_published:,} of {summary.rows_total:,}")),
        ("rows already published before this run", md_text(f"{summary.rows_skipped:,}")),
        ("rows published meanwhile by a concurrent run", md_text(f"{summary.rows_concurrent:,}")),
        (
            "dead letters",
            md_text(
                f"{summary.rows_failed:,}"
                + (f" ({summary.rows_empty:,} empty texts, skipped)" if summary.rows_empty else "")
            ),
        ),
        (
            "chunks",
            md_text(
                f"{summary.chunks_published} published now, {summary.chunks_skipped} "
                f"skipped, {summary.chunks_failed} failed, {summary.chunks_released} "
                f"released, {summary.chunks_not_run} not run, of {summary.chunks_total}"
                if summary.chunks_total
                else "none to write"
            ),
        ),
        (
            "chunks by ledger state",
            md_text(", ".join(f"{k} {v}" for k, v in sorted((chunk_states or {}).items())) or "-"),
        ),
        ("tokens (reported by the API)", md_text(f"{summary.tokens:,}")),
        ("inputs charged", md_text(_charged_phrase(summary))),
        ("requests", md_text(_requests_phrase(summary))),
        ("rows reused from earlier runs", md_text(f"{summary.rows_reused:,}")),
        ("rows deduplicated in this run", md_text(f"{summary.rows_deduplicated:,}")),
        ("estimated cost", md_text(_cost_phrase(summary, price))),
        (
            "saved by reuse and deduplication",
            md_text(
                saved_phrase(
                    rows=summary.rows_reused + summary.rows_deduplicated,
                    tokens_saved=summary.tokens_saved,
                    measured=summary.tokens_saved_measured,
                    price=price,
                )
            ),
        ),
    ]
    if summary.batch_tokens:
        _, batch_saved = run_cost(summary.tokens, summary.batch_tokens, price or 0.0)
        rows.append(
            (
                "saved by the Batch API (half price)",
                md_text(
                    f"{usd(batch_saved)} on {summary.batch_tokens:,} tokens"
                    if price is not None
                    else f"half the price of {summary.batch_tokens:,} tokens"
                ),
            )
        )
    rows += [
        (
            "wall time",
            md_text(
                f"{summary.wall_s:.1f} s"
                + (" (the run; the load below has its own)" if summary.load else "")
            ),
        ),
        ("output", _code(summary.output)),
        ("manifest", _code(summary.manifest_uri) if summary.manifest_uri else "not committed"),
        ("changes", _changes_cell(summary)),
    ]
    lines = ["# embedline run", "", *_table(rows)]
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
            f"| {d.row_number} | `{_cell(d.id)}` | {md_text(d.reason)} | {d.http_status or ''} |"
            for d in dead_letters[:_MAX_DEAD_LETTERS_SHOWN]
        ]
    return "\n".join(lines) + "\n"


def _charged_phrase(summary: RunSummary) -> str:
    """``886,323 texts answered with vectors (12 of them in Batch API batches)``; an
    in-process model's texts are embedded, not charged."""
    if summary.requests == 0 and summary.inputs and not summary.batch_inputs:
        return f"none: {summary.inputs:,} texts embedded in-process (no API request)"
    return f"{summary.inputs:,} texts answered with vectors" + (
        f" ({summary.batch_inputs:,} of them in Batch API batches)" if summary.batch_inputs else ""
    )


def _requests_phrase(summary: RunSummary) -> str:
    """``1,204 sent; 18 without vectors (18,000 texts: rate limited, server errors,
    timeouts, refusals; not charged)``."""
    return f"{summary.requests:,} sent" + (
        f"; {summary.requests_retried:,} without vectors ({summary.inputs_retried:,} texts: "
        "rate limited, server errors, timeouts, refusals; not charged)"
        if summary.requests_retried
        else ("; each answered with vectors" if summary.requests else "")
    )


def _cost_phrase(summary: RunSummary, price: float | None) -> str:
    """What the reported tokens cost at ``price`` (USD per 1M tokens), Batch API tokens at
    half of it."""
    if price is None:
        return "n/a (no price given)"
    spent, _ = run_cost(summary.tokens, summary.batch_tokens, price)
    return f"{usd(spent)} (at ${price:g} per 1M tokens" + (
        f"; {summary.batch_tokens:,} tokens at the batch price, ${price / 2:g} per 1M)"
        if summary.batch_tokens
        else ")"
    )


def _changes_cell(summary: RunSummary) -> str:
    if summary.rows_added is None:
        return "none (no manifest committed)"
    base = (
        f"against run {_code(summary.changes_base[:12])}"
        if summary.changes_base
        else "first run of this dataset on this output"
    )
    return (
        md_text(
            f"{summary.rows_added:,} added, {summary.rows_changed:,} changed, "
            f"{summary.rows_removed:,} removed, {summary.rows_unchanged:,} unchanged ("
        )
        + f"{base}): {_code(summary.changes_object)}"
    )


def _code(value: object) -> str:
    """``value`` as a code span in a table cell (a backtick would end it, a pipe the cell)."""
    return f"`{_cell(str(value))}`"


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
        (
            "status",
            f"**{md_text(summary.status)}**"
            + (f": {md_text(summary.message)}" if summary.message else ""),
        ),
        ("sink", _code(summary.sink)),
        ("run key", _code(summary.run_key)),
        ("mode", md_text(summary.mode or "-")),
        ("rows", md_text(load_rows_phrase(summary))),
        (
            "chunks",
            md_text(
                f"{summary.chunks_loaded} loaded now, {summary.chunks_skipped} skipped, "
                f"{summary.chunks_failed} failed, of {summary.chunks_total}"
            ),
        ),
        ("index", md_text(index_phrase(summary))),
        ("wall time", md_text(f"{summary.wall_s:.1f} s (the load, index included)")),
    ]
    return _table(rows)[2:]


def load_rows_phrase(summary: LoadSummary) -> str:
    """``63,904 upserted now, 0 held before, 0 deleted``."""
    return (
        f"{summary.rows_loaded:,} upserted now, {summary.rows_skipped:,} held before, "
        f"{summary.rows_deleted:,} deleted"
    )


def index_phrase(summary: LoadSummary) -> str:
    """``HNSW index built in 86.5 s``; ``-`` when the load did not get that far; a deferred
    build as it is (nothing built, no seconds to give)."""
    if not summary.index_state:
        return "-"
    if summary.index_state.startswith("deferred"):
        return summary.index_state
    return f"{summary.index_state} in {summary.index_s:.1f} s"


def publish_load_summary(summary: LoadSummary) -> None:
    """Create the ``embedline-load-summary`` artifact of a ``load-run`` flow run."""
    create_markdown_artifact(
        load_markdown(summary),
        key="embedline-load-summary",
        description=f"embedline load {summary.status}",
    )
