"""Batch API mode (``--batch-api``): submit the chunks' requests as batches, wait, collect.

Runs in the flow process before the chunk tasks (docs/design.md, "Batch API mode"):

    for each chunk to embed: its reuse plan (``ReuseStage.plan_for``, the plan its task
    gets) → its requests (``chunk_requests``) → parts (``pack``) recorded ``creating``
    with their layout (each request's custom_id and row positions) → the parts of
    consecutive chunks packed into batches up to the provider's limits (``pack_parts``:
    a night of small edits over many chunks makes a few batches, not one per chunk) →
    upload + create, one by one, each batch's parts recorded ``submitted`` with its id →
    one poller for all of the run's batches, the
    interval growing to ``--batch-poll-interval`` → a chunk whose batches all ended has its
    unanswered requests submitted again as new parts while ``tasks.batch.rounds`` allows
    (or left to ``--batch-fallback sync``) → when every chunk is ready, the ordinary chunk
    tasks run with the chunk's result files and recorded layouts (``tasks.batch.answers``):
    same objects, manifest, change set and sinks as a synchronous run.

What a batch carries is read from the ledger (its layout), never derived again from the
run's settings: a rerun with another ``--batch-size``, ``--batch-max-inputs`` or
``--max-request-tokens`` collects the batches already submitted, resubmits their
unanswered requests as they were, and batches with its own settings only rows no batch of
the run carries.

Exactly once: a part is recorded before its create, and one still ``creating`` is looked for
in the account's batch list and adopted when it was created from the part's upload
(``tasks.batch.calls``, which records every answer of the provider). A rerun after a crash or
Ctrl-C (batches keep running at the provider) polls and collects what the ledger records; a
chunk the ledger records no batch of (a fresh or lost ledger) first adopts the run's batches
that carry that chunk's parts and that the list holds (``_adopt_unrecorded``; a batch that
packs many chunks is adopted by each of them): the ledger is a cache, the provider the
truth.

Stopping: the flow runs the stage under ``flows.signals.dispatch_with_graceful_stop``, as it
runs the chunk dispatcher, so the first SIGINT/SIGTERM (or a cancel from Prefect) calls
``BatchStage.stop``: a create in progress ends and is recorded, nothing more is submitted,
the wait ends, and the stage returns ``Staged.interrupted`` with the batches left running
at the provider said in ``STOP.report.note_left_running`` (the run's summary and last line
name ``embedline cancel-batches RUN``), so the command prints its summary. Any other end with
batches still running (an error raised out of the stage, a failed validation) notes them the
same way (``tasks.batch.records.left_running_note``).

A batch ``failed`` for ``token_limit_exceeded`` (or a create refused so) teaches the stage a
token cap: parts larger than it are split to fit, the refused requests submitted again after
the run's batches in flight end, and a refusal no wait can end stops the run saying what to
change (``flows.batch_tokens``). Any other ``failed`` stops the run with the server's reason
(exit 3), nothing more submitted. A batch or file the provider answers 404 for
(``UnknownBatchError``: another API key, purged, deleted) stops the run (exit 3), marked
``not_found`` in the ledger; it is never resubmitted on its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.embeddings import build_batch_client
from adapters.embeddings.openai_batch import TERMINAL_STATUSES, BatchClient, TokenLimitError
from adapters.ledger import BatchRecord, Ledger
from embedline.errors import RetryableError
from embedline.models import ChunkBatches, ChunkSpec, ReusePlan, Row
from embedline.progress import BatchCount
from embedline.settings import RunSettings
from embedline.shutdown import STOP
from flows.batch_report import BatchProgress, note_left_running
from flows.batch_tokens import TokenLimit
from tasks.batch.calls import BatchCalls, Log, batch_metadata
from tasks.batch.outputs import OUTPUTS
from tasks.batch.parts import PartRequests
from tasks.batch.records import (
    all_answered,
    batch_requests,
    failed_for_token_limit,
    ids_late,
    merged_layouts,
)
from tasks.batch.requests import (
    BatchRequest,
    fit,
    input_file,
    layout_from_input,
    layout_of,
    pack,
    pack_parts,
    unique,
)
from tasks.batch.rounds import Rounds
from tasks.reuse.stage import ReuseStage

__all__ = ["BatchStage", "Staged"]

_FIRST_POLL_S = 0.05  # seconds; the interval grows by half each poll to --batch-poll-interval


@dataclass(slots=True)
class Staged:
    """The stage's outcome: by chunk index, the reuse plan its task gets and what its
    batches answered (result files and recorded layouts; chunks not ready are absent);
    ``fatal``: why the run stopped (a batch failed validation), or None."""

    plans: dict[int, ReusePlan] = field(default_factory=dict)
    answers: dict[int, ChunkBatches] = field(default_factory=dict)
    fatal: str | None = None
    batches: int = 0
    interrupted: bool = False  # stopped (``BatchStage.stop``) before every chunk was ready


class BatchStage:
    """Submits, polls and collects the batches of ``todo`` (see the module docstring).

    ``client``: the Batch API client (default: ``build_batch_client(settings)``);
    ``on_progress``: called after each poll with the run's batches by status (the CLI's
    progress bar or lines); ``sleep`` and ``clock`` (seconds) are injected by tests (the
    default sleep ends early when ``stop`` is called).
    """

    def __init__(
        self,
        *,
        settings: RunSettings,
        ledger: Ledger,
        run_key: str,
        planner: ReuseStage,
        source: Any,
        log: Log,
        client: BatchClient | None = None,
        on_progress: Callable[[tuple[BatchCount, ...]], None] | None = None,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.ledger, self.run_key = settings, ledger, run_key
        self.planner, self.source, self.log = planner, source, log
        self.client = client or build_batch_client(settings)
        self.calls = BatchCalls(self.client, ledger, run_key, log)
        self._stopped = threading.Event()
        self.progress = BatchProgress(log, on_progress)
        self.sleep, self.clock = sleep or self._stopped.wait, clock
        self.staged = Staged()
        self.parts = PartRequests(settings, source, self.staged.plans, self.calls)
        self._specs: dict[int, ChunkSpec] = {}
        self.rounds = Rounds(clock)  # unanswered requests submitted again: when
        self._ended = 0  # the run's batches seen ended (progress: the backoff resets)
        self._sent: set[tuple[int, int]] = set()  # (chunk, part) whose create was sent
        # parts to submit, packed into batches by ``_flush``: (chunk, its record, requests)
        self._queue: list[tuple[ChunkSpec, BatchRecord, list[BatchRequest]]] = []
        self._queued: set[tuple[int, int]] = set()
        self.tokens = TokenLimit(
            settings=settings, ledger=ledger, run_key=run_key, log=log, sent=self._sent, clock=clock
        )

    # ── the stage ────────────────────────────────────────────────────────────────────────
    def run(self, todo: Sequence[ChunkSpec]) -> Staged:
        """Submit and wait for the batches of ``todo``; return what the chunk tasks need
        (``interrupted`` after ``stop``: the batches keep running, noted for the summary).

        Whenever it ends with batches still running at the provider (a stop, a batch that
        failed validation, an error raised out of it), ``STOP.report.note_left_running`` says how
        many and both ways on (rerun to collect them, ``embedline cancel-batches`` to cancel
        them): the run's final message carries it (``flows.run_outcome``).

        :raises KeyboardInterrupt, Terminated: raised into the stage (not through ``stop``):
            the batches keep running (logged); a rerun collects them.
        :raises UnknownBatchError: the provider does not know a batch or file the ledger
            recorded (another API key, purged, deleted): the batch is marked ``not_found``
            in the ledger (``embedline status RUN`` shows it); nothing is resubmitted.
        :raises EmbedlineError: the Batch API failed past its retries, or its endpoint
            refuses every connection (``FatalError``: never reached; ``EndpointDownError``).
        """
        STOP.report.note_left_running(None)  # an earlier run's, in a long-lived process
        OUTPUTS.clear()  # an earlier run's result files, in a long-lived process
        try:
            for spec in todo:
                if self._stopped.is_set() or self.staged.fatal:
                    break
                self._specs[spec.index] = spec
                self.staged.plans[spec.index] = self.planner.plan_for(spec)
                self._start(spec)
                self._check_failures(self.ledger.run_batches(self.run_key, spec.index), spec)
                self._flush(final=False)  # the batches full so far
            if not self.staged.fatal:
                self._flush(final=True)
                self._wait()
        except BaseException:  # an interrupt, the Batch API failing: batches may run on
            self._left_running()
            raise
        self.staged.interrupted = self._stopped.is_set() and not self.staged.fatal
        self._left_running()  # a stop or a failed validation: the others run on
        self._count()
        return self.staged

    def stop(self, *, grace_s: float | None = None) -> None:
        """Submit nothing more and stop waiting (from a signal handler or another thread):
        ``run`` returns once a create in progress is recorded. ``grace_s`` is ignored:
        nothing here is worth waiting for, the batches run on at the provider."""
        self._stopped.set()

    def _count(self) -> None:
        self.staged.batches = len(  # a batch that packs many chunks' parts counted once
            {
                r.batch_id
                for r in self.ledger.run_batches(self.run_key)
                if r.batch_id and r.idx in self._specs
            }
        )

    def _start(self, spec: ChunkSpec) -> None:
        """Record and submit the chunk's parts, or adopt those a crashed run created; rows
        the chunk needs that no recorded part carries (a rerun planned reuse otherwise)
        go in a part of their own."""
        rows = self.parts.rows(spec)
        requests = self.parts.needed(spec, rows)
        if requests:
            self._adopt_unrecorded(spec, rows)
        for record in self.ledger.run_batches(self.run_key, spec.index):
            if record.state == "creating":
                self._resume_creating(spec, record, rows)
        records = self.ledger.run_batches(self.run_key, spec.index)
        if not records:
            if not requests:
                self.staged.answers[spec.index] = ChunkBatches()
                return
            requests = fit(requests, self.tokens.budget())
            parts = pack(requests, self.settings, max_tokens=self.tokens.budget())
            self.ledger.add_batch_parts(
                self.run_key,
                spec.index,
                spec.key,
                [(p, a, b, layout_of(requests[a:b])) for p, (a, b) in enumerate(parts)],
            )
            for record in self.ledger.run_batches(self.run_key, spec.index):
                self._submit(spec, record, requests[record.req_start : record.req_stop])
            return
        covered = {p for r in self.parts.recorded(spec, rows, records) for p in r.rows}
        uncovered = {p for r in requests for p in r.rows} - covered
        if uncovered:
            rest = self.parts.needed(spec, rows, only=uncovered)
            self.log.info(
                "chunk %d: %d rows no batch of this run carries: submitting them as part %d",
                spec.index,
                len(uncovered),
                max(r.part for r in records) + 1,
            )
            self._submit_rest(spec, records, rest)

    def _adopt_unrecorded(self, spec: ChunkSpec, rows: list[Row]) -> None:
        """Adopt the provider's batches of this chunk that the ledger does not record (a
        fresh or lost ledger: ``BatchCalls.unrecorded``), each as the part its metadata
        names, carrying the requests its input file holds (``layout_from_input``). Parts
        recorded ``creating`` but never uploaded were never created: dropped once a batch
        is adopted (the rows no adopted batch carries go in a part of their own)."""
        found = self.calls.unrecorded(spec)
        records = {r.part: r for r in self.ledger.run_batches(self.run_key, spec.index)}
        adopted = False
        for part, batch in sorted(found.items()):
            record = records.get(part)
            if record is not None and (record.batch_id or record.input_file_id):
                continue  # a batch of its own, or an upload matched by its file id
            layout = layout_from_input(
                rows, self.calls.input_of(batch, spec.index, part), self.settings
            )
            if not layout:
                continue  # none of its requests is this chunk's now
            if not adopted:
                for other in records.values():
                    if other.state == "creating" and not other.input_file_id:
                        self.ledger.drop_batch_part(self.run_key, spec.index, other.part)
                adopted = True
            self.ledger.add_batch_parts(
                self.run_key, spec.index, spec.key, [(part, 0, len(layout), layout)]
            )
            (record,) = (
                r for r in self.ledger.run_batches(self.run_key, spec.index) if r.part == part
            )
            self.calls.adopt(spec, record, batch)

    def _resume_creating(
        self, spec: ChunkSpec, record: BatchRecord, rows: list[Row] | None = None
    ) -> None:
        # a part whose input was never uploaded was never created: nothing to look for
        adopted = (
            self.calls.find(spec, record.part, record.input_file_id)
            if record.input_file_id
            else None
        )
        if adopted is not None:
            self.calls.adopt(spec, record, adopted)
            return
        if record.layout is None and record.req_start is None:  # recorded without layouts
            requests = self.parts.pending(
                spec,
                [
                    r
                    for r in self.ledger.run_batches(self.run_key, spec.index)
                    if r.part < record.part
                ],
            )
        else:
            requests = self.parts.carried(spec, record, rows or self.parts.rows(spec))
        if requests:
            self._submit(spec, record, requests)
        else:
            self.ledger.drop_batch_part(self.run_key, spec.index, record.part)

    # ── create ───────────────────────────────────────────────────────────────────────────
    def _submit(self, spec: ChunkSpec, record: BatchRecord, requests: list[BatchRequest]) -> None:
        """Queue the part for ``_flush``, which packs it with other chunks' parts into a
        batch (a part already uploaded is created again from its upload)."""
        key = (spec.index, record.part)
        if key not in self._queued:
            self._queued.add(key)
            self._queue.append((spec, record, requests))

    def _flush(self, *, final: bool) -> None:
        """Create the batches of the queued parts: those uploaded, from their upload; the
        others packed in order (``pack_parts``) up to the provider's limits and the
        enqueued-token budget. ``final=False``: only full batches (the last stays queued
        for the next chunks' parts)."""
        queue, self._queue = self._queue, []
        uploaded: dict[str, list[tuple[ChunkSpec, BatchRecord, list[BatchRequest]]]] = {}
        fresh: list[tuple[ChunkSpec, BatchRecord, list[BatchRequest]]] = []
        for item in queue:
            if item[1].input_file_id:
                uploaded.setdefault(item[1].input_file_id, []).append(item)
            else:
                fresh += self._fitted(*item)
        groups: list[tuple[list[tuple[ChunkSpec, BatchRecord, list[BatchRequest]]], str | None]]
        groups = [(units, file_id) for file_id, units in uploaded.items()]
        packed = pack_parts(
            [requests for _, _, requests in fresh], self.settings, max_tokens=self.tokens.budget()
        )
        if not final and packed:
            start, _ = packed.pop()  # not full yet: more parts may join it
            self._queue = fresh[start:]
        groups += [(fresh[a:b], None) for a, b in packed]
        for units, file_id in groups:
            for spec, record, _ in units:
                self._queued.discard((spec.index, record.part))
            if not self._stopped.is_set() and not self._failed():
                self._create(units, file_id)

    def _fitted(
        self, spec: ChunkSpec, record: BatchRecord, requests: list[BatchRequest]
    ) -> list[tuple[ChunkSpec, BatchRecord, list[BatchRequest]]]:
        """A part never uploaded, as it is when it fits the budget, else split into parts
        that do (``_submit_rest``: recorded in its place, which no batch carries)."""
        budget = self.tokens.budget()
        if budget is None or sum(q.estimated_tokens for q in requests) <= budget:
            return [(spec, record, requests)]
        fitted = fit(requests, budget)
        if len(pack(fitted, self.settings, max_tokens=budget)) < 2:
            return [(spec, record, requests)]  # one input, or one request: nothing to split
        records = self.ledger.run_batches(self.run_key, spec.index)
        self.ledger.drop_batch_part(self.run_key, spec.index, record.part)
        self._queued.discard((spec.index, record.part))  # its number may be taken again
        self.log.info(
            "chunk %d part %d: larger than the enqueued-token budget (%d estimated tokens): "
            "split to fit",
            spec.index,
            record.part,
            budget,
        )
        queued, self._queue = self._queue, []
        self._submit_rest(spec, records, fitted)
        split, self._queue = self._queue, queued
        return split

    def _create(
        self,
        units: list[tuple[ChunkSpec, BatchRecord, list[BatchRequest]]],
        file_id: str | None,
    ) -> None:
        """Upload the parts ``units`` as one input file (unless ``file_id``: uploaded) and
        create their batch (sent once); a create that failed or timed out is looked for in
        the list and adopted; a token-limit refusal leaves the parts ``creating`` until
        earlier batches finish; so does a ``stop`` (the next run submits them)."""
        self._wait_for_token_budget()
        if self._stopped.is_set():
            return
        first = units[0]
        if file_id is None:
            name = f"embedline-{self.run_key[:12]}-{first[0].index:05d}-{first[1].part}"
            if len(units) > 1:
                name += f"-{units[-1][0].index:05d}-{len(units)}parts"
            file_id = self.client.upload(
                f"{name}.jsonl",
                input_file(((s.index, r.part, q) for s, r, q in units), self.settings),
            )
            for spec, record, _ in units:
                self.ledger.note_batch_input(self.run_key, spec.index, record.part, file_id)
        metadata = batch_metadata(self.run_key, [(s, r.part) for s, r, _ in units])
        self._sent.update((s.index, r.part) for s, r, _ in units)
        tokens = sum(q.estimated_tokens for _, _, requests in units for q in requests)
        try:
            batch = self.client.create_batch(file_id, metadata)
        except TokenLimitError as exc:
            for spec, record, _ in units:  # refused, never created: packed again to fit
                self.ledger.note_batch_input(self.run_key, spec.index, record.part, None)
                self._sent.discard((spec.index, record.part))
            self.staged.fatal = self.tokens.refused_at_create(
                str(exc), tokens, [q for _, _, requests in units for q in requests], first[0].index
            )
            return
        except RetryableError as exc:
            self.log.warning(
                "chunk %d part %d (%d parts packed): the batch create failed (%s): looking for "
                "the batch it may have made",
                first[0].index,
                first[1].part,
                len(units),
                exc,
            )
            self.calls.forget_listing()  # list again: the batch would be new
            found = self.calls.find(first[0], first[1].part, file_id)
            if found is None:
                return  # still `creating`: submitted again on the next poll
            batch = found
        self.tokens.created_batch(str(batch["id"]), tokens, failed=batch.get("status") == "failed")
        for spec, record, _ in units:
            self.calls.adopt(spec, record, batch, created=True)
        # failed validation at once: nothing more is created (one chunk's records say it)
        self._check_failures(self.ledger.run_batches(self.run_key, first[0].index), first[0])

    def _wait_for_token_budget(self) -> None:
        delay = self.tokens.backoff.delay()
        if delay > 0:
            self.sleep(delay)
            self._poll_all()

    def _failed(self) -> bool:
        """Whether a batch failed validation (``Staged.fatal``): a method, not the field, so
        that a check after a call that may set it is not narrowed away."""
        return self.staged.fatal is not None

    # ── wait ─────────────────────────────────────────────────────────────────────────────
    def _wait(self) -> None:
        interval = min(_FIRST_POLL_S, self.settings.batch_poll_interval_s)
        while not self._failed() and not self._stopped.is_set():
            records = self._poll_all()
            ended = {
                r.batch_id for r in records if r.status in ("completed", "expired", "cancelled")
            }
            if len(ended) > self._ended:  # a batch of the run ended: budget freed
                self._ended = len(ended)
                self.tokens.backoff.progress()
            totals = batch_requests(records)
            open_chunks = [i for i in self._specs if i not in self.staged.answers]
            for index in open_chunks:
                self._advance(self._specs[index], [r for r in records if r.idx == index], totals)
                if self._failed():
                    return
            self._flush(final=True)  # resubmitted and still-creating parts, packed
            if self._failed():
                return
            if all(i in self.staged.answers for i in self._specs):
                return
            self.progress.show(self.ledger.run_batches(self.run_key), self._specs)
            self.sleep(interval)
            interval = min(interval * 1.5, self.settings.batch_poll_interval_s)

    def _poll_all(self) -> list[BatchRecord]:
        polled: set[str] = set()  # a batch that packs many chunks' parts: polled once
        for record in self.ledger.run_batches(self.run_key):
            if (
                record.idx in self._specs
                and record.batch_id
                and record.batch_id not in polled
                and (record.status not in TERMINAL_STATUSES or ids_late(record))
            ):
                polled.add(record.batch_id)
                self.calls.record_poll(self.calls.get_batch(record))  # running, or its ids are late
        return self.ledger.run_batches(self.run_key)

    def _advance(self, spec: ChunkSpec, records: list[BatchRecord], totals: dict[str, int]) -> None:
        """Move one chunk on: resubmit a part still ``creating``; when all its batches have
        ended, stop on a validation failure, else submit what is unanswered or mark the
        chunk ready. ``totals``: each batch's requests (``batch_requests``)."""
        for record in records:
            if record.state == "creating" and self.tokens.backoff.delay() == 0:
                self._resume_creating(spec, record)
        records = self.ledger.run_batches(self.run_key, spec.index)
        if any(
            r.state == "creating" or r.status not in TERMINAL_STATUSES or ids_late(r)
            for r in records
        ):
            return
        self._check_failures(records, spec)
        if self.staged.fatal:
            return
        if all(all_answered(r, totals.get(r.batch_id or "")) for r in records):
            self._ready(spec, records)
            return
        unanswered = self.parts.unanswered(spec, records)
        pending = unanswered.pending
        sync = self.settings.batch_fallback == "sync"
        if pending and not sync:
            again = self.rounds.again(
                spec.index, pending=len(pending), errored=len(unanswered.errored)
            )
            if again:
                self.log.info(
                    "chunk %d: %d requests left unanswered (expired, cancelled, refused for "
                    "the token limit or server errors): submitting them again from part %d",
                    spec.index,
                    len(pending),
                    max(r.part for r in records) + 1,
                )
                self._submit_rest(spec, records, pending)
                return
        if pending:
            self.log.warning(
                "chunk %d: %d requests unanswered by its batches%s",
                spec.index,
                len(pending),
                ", sent synchronously"
                if sync
                else " after the completion window or repeated server errors: a rerun "
                "submits them again, --batch-fallback sync sends them synchronously",
            )
        self._ready(spec, records)

    def _submit_rest(
        self, spec: ChunkSpec, records: list[BatchRecord], requests: list[BatchRequest]
    ) -> None:
        """Record ``requests`` (each once, split to fit the enqueued-token budget) as the
        chunk's next parts (after ``records``) and submit them."""
        requests = fit(unique(requests), self.tokens.budget())
        first = max(r.part for r in records) + 1
        spans = {
            first + n: span
            for n, span in enumerate(pack(requests, self.settings, max_tokens=self.tokens.budget()))
        }
        self.ledger.add_batch_parts(
            self.run_key,
            spec.index,
            spec.key,
            [(part, None, None, layout_of(requests[a:b])) for part, (a, b) in spans.items()],
        )
        for record in self.ledger.run_batches(self.run_key, spec.index):
            if record.part in spans:
                a, b = spans[record.part]
                self._submit(spec, record, requests[a:b])

    def _check_failures(self, records: list[BatchRecord], spec: ChunkSpec) -> None:
        """A batch ``failed`` validation: the run stops (``fatal``); one that failed for
        the token limit: later creates wait (once per batch)."""
        for record in records:
            if record.status != "failed":
                continue
            if not failed_for_token_limit(record):
                self.staged.fatal = (
                    f"batch {record.batch_id} (chunk {spec.index}) failed "
                    f"validation: {record.error or 'no reason given'}; "
                    "nothing more is submitted"
                )
                return
            self.staged.fatal = self.tokens.refused_batch(record, spec.index)
            if self.staged.fatal:
                return

    def _ready(self, spec: ChunkSpec, records: list[BatchRecord]) -> None:
        files = tuple(
            dict.fromkeys(f for r in records for f in (r.output_file_id, r.error_file_id) if f)
        )
        layouts = [r.layout for r in records]
        if any(layout is None for layout in layouts):  # recorded without layouts
            layouts = [layout_of(self.parts.recorded(spec, self.parts.rows(spec), records))]
        self.staged.answers[spec.index] = ChunkBatches(
            files, merged_layouts(layouts), chunk=spec.index
        )

    def _left_running(self) -> None:
        """Note and log the batches the run leaves running at the provider, if any
        (``flows.batch_report.note_left_running``)."""
        note_left_running(self.ledger.run_batches(self.run_key), self._sent, self.run_key, self.log)
