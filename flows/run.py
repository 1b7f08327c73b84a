"""``Run``: one run of the pipeline, the object that holds its state from plan to commit.

One driver (``flows.driver.drive``) takes every run through its steps, in this order,
for the ``embed-csv`` flow and for the CLI's path without Prefect alike (docs/design.md,
"Layers"; the commit: docs/reference/output-layout.md):

    open (plan, resolve the target) → record (ledger) → check the store (conditional
    writes) → lease → work left (published chunks, dead letters to retry) → [wait for an
    earlier live run on the output, then work left again] → [dispatch: embed + publish] →
    conclude (missing objects, lengths, change set + manifest under deferred interrupts,
    ledger) → [load]

A step that ends the run before its commit raises ``RunStopped`` (``RunRefused`` before
anything is recorded) carrying the summary; the driver's one handler returns it.

No Prefect here (the CLI uses it before Prefect starts); the flow passes its Prefect pieces
in (the ``plan-input`` task, its run logger). Every ``RunSummary`` is built here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from adapters.ledger import Ledger, record_hard_stop
from adapters.scratch import release
from embedline.delete_share import MassDeleteError
from embedline.errors import ConflictError, EmbedlineError, InputError
from embedline.interrupts import interrupt_of
from embedline.models import (
    ChunkOutcome,
    ChunkSpec,
    InputPlan,
    chunk_generation,
    committed_dead_letters_note,
    manifest_object_key,
)
from embedline.progress import Usage
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from embedline.shutdown import STOP
from embedline.summary import RunSummary
from flows.dispatch import DispatchResult
from flows.events import run_payload
from flows.interrupt_handlers import committing
from flows.run_outcome import outcome_fields, with_inherited
from flows.run_stops import NightOfAnotherLength, RunRefused, RunStopped
from tasks.commit.commit_run import commit_run, ledger_catches_up, missing_objects
from tasks.commit.manifest import already_complete_fields, change_fields
from tasks.commit.unwritten import record_unwritten_empties
from tasks.lease.run_lease import run_lease
from tasks.plan.delta import delta_night
from tasks.plan.published import find_published, retries_dead_letters
from tasks.plan.target import REASONS, RunTarget, resolve_run_target
from tasks.publish.dimensions import RunLength, other_lengths, pinned_length, with_lengths

__all__ = ["CommittedRun", "NightOfAnotherLength", "Run", "RunRefused", "RunStopped", "Work"]

Log = logging.Logger | logging.LoggerAdapter[logging.Logger]
_NOTHING_SENT = "every chunk was already published: committed without embedding"


@dataclass(slots=True)
class Work:
    """What a recorded run has left to do: ``skipped`` chunks published before it (by
    index), ``todo`` chunk specs to embed (sorted by index; superseding generations of
    chunks whose dead letters are retried included) and the run's vector ``length``."""

    skipped: dict[int, ChunkOutcome]
    todo: list[ChunkSpec]
    length: RunLength = field(default_factory=RunLength)


@dataclass(slots=True)
class CommittedRun:
    """A run's committed summary and the manifest that stands (ours, or that of a
    concurrent run of the same key that committed first)."""

    summary: RunSummary
    manifest: dict[str, Any]


class Run:
    """One run of ``settings`` over ``plan`` into ``store``, resolved to ``target``.

    Build it with ``Run.open``. ``started`` is ``time.monotonic()`` at the command's or
    flow's start: every summary's ``wall_s`` (seconds) counts from it. ``log`` receives the
    run's info and warning lines (the flow's run logger; a stdlib logger in the CLI).
    """

    def __init__(
        self,
        settings: RunSettings,
        store: ObjectStore,
        plan: InputPlan,
        target: RunTarget,
        *,
        started: float,
        log: Log,
    ) -> None:
        self.settings, self.store, self.plan, self.target = settings, store, plan, target
        self.started, self.log = started, log
        self.ledger: Ledger | None = None
        self.learned_length: int | None = None

    # ── open ──────────────────────────────────────────────────────────────────────────────
    @classmethod
    def open(
        cls,
        settings: RunSettings,
        *,
        store: ObjectStore,
        plan_input: Callable[[RunSettings], InputPlan],
        log: Log,
        started: float | None = None,
        full_night: bool = False,
        learned_length: int | None = None,
        prepare_output: bool = True,
    ) -> Run:
        """Prepare the output, plan the input (``plan_input``) and resolve the run's target;
        a delta night when the run has a base (``tasks.plan.delta.delta_night``) unless
        ``full_night``. ``learned_length``: the vector length the server answered with
        earlier in this command (a delta night's, ``NightOfAnotherLength``): the run's.
        ``prepare_output`` False (a dry run, ``flows.estimate``): the output is read as it
        is, never created.

        :raises RunRefused: the run cannot start: an input error (exit 2, or the error's
            code: a missing output directory's parent, an unreadable input) or a store that
            cannot be read (the error's exit code). Nothing is recorded.
        """
        started = time.monotonic() if started is None else started
        try:
            if prepare_output:
                store.prepare()
            plan = plan_input(settings)
        except InputError as exc:
            raise RunRefused(cls.refused(exc.exit_code, "input_error", str(exc))) from None
        try:
            target = resolve_run_target(store, plan, settings)
        except EmbedlineError as exc:
            raise _refusal(plan, store, exc, "fatal") from None
        # a generation retrying dead letters or compacting writes whole objects; one that
        # commits an earlier night's input again is a delta of the night before, as any night
        whole = bool(target.supersedes) and target.reason != "overtaken"
        if target.committed is None and not (whole or plan.delta or full_night):
            try:
                plan = delta_night(store, plan, settings, log=log)
            except MassDeleteError as exc:  # known before anything is sent
                raise _refusal(plan, store, exc, "delete_refused") from None
        run = cls(settings, store, plan, target, started=started, log=log)
        run.learned_length = learned_length
        if target.supersedes and target.committed is None:
            log.info(
                "run %s is committed, and %s: committing generation %d as run %s",
                target.supersedes,
                REASONS[target.reason],
                target.generation,
                target.run_key,
            )
        return run

    @property
    def run_key(self) -> str:
        """The run's key (64 hex characters, docs/reference/keys.md)."""
        return self.target.run_key

    @property
    def committed(self) -> dict[str, Any] | None:
        """The run's manifest if it is already committed (nothing to embed), else None."""
        return self.target.committed

    # ── summaries: the one place they are built ──────────────────────────────────────────
    @staticmethod
    def refused(exit_code: int, status: str, message: str, **fields: Any) -> RunSummary:
        """The summary of a run that never started (invalid parameters, no API key, an
        input error): ``exit_code`` per docs/reference/cli.md, no run key."""
        return RunSummary(exit_code, status, message, **fields)

    def summary(self, base: RunSummary | None = None, **changes: Any) -> RunSummary:
        """``base`` (default: the run's empty summary: key, output, totals, generation)
        with ``changes``; ``wall_s`` is the seconds since the run started unless given."""
        fields: dict[str, Any] = (
            base.to_dict()
            if base is not None
            else dict(
                exit_code=0,
                status="running",
                message="",
                run_key=self.run_key,
                output=self.store.uri,
                rows_total=self.plan.rows,
                chunks_total=len(self.plan.chunks),
                generation=self.target.generation,
                supersedes=self.target.supersedes,
                price_per_million_tokens=self.settings.price_per_million_tokens,
            )
        )
        fields.update(changes)
        fields.setdefault("wall_s", 0.0)
        if "wall_s" not in changes:
            fields["wall_s"] = round(time.monotonic() - self.started, 3)
        return RunSummary(**fields)

    def already_committed(self) -> RunSummary:
        """The summary of a run found committed: nothing embedded, nothing written to the
        store; the ledger catches up if it lags the store (``ledger_catches_up``)."""
        manifest = self.target.committed
        assert manifest is not None, "already_committed() of a run to embed"
        uri = self.store.uri_for(manifest_object_key(self.run_key))
        self.log.info("run %s is already complete: manifest %s", self.run_key, uri)
        if ledger_catches_up(self.settings.ledger, manifest, uri):
            self.log.info(
                "the ledger now records run %s as complete, as the store does", self.run_key
            )
        fields = already_complete_fields(manifest)
        if self.settings.compact:  # asked for, and not needed (tasks/plan/target.py)
            fields["message"] += " (--compact: its objects hold no dropped rows)"
        return self.summary(**fields, manifest_uri=uri)

    # ── record ───────────────────────────────────────────────────────────────────────────
    def hard_stop_hook(self) -> Callable[[], None]:
        """What a hard exit of this process runs: mark the run ``interrupted`` in the
        ledger (on a connection of its own: ``record_hard_stop``)."""
        return functools.partial(record_hard_stop, self.settings.ledger, self.run_key)

    def open_ledger(self) -> Ledger:
        """Open the run's ledger (``settings.ledger``; SQLite, docs/reference/ledger.md) for
        ``recorded``.

        :raises DiskFullError: the ledger's filesystem is full (exit 1, nothing started).
        :raises OSError, sqlite3.Error: the ledger cannot be opened.
        """
        self.ledger = Ledger(self.settings.ledger)
        return self.ledger

    def close(self) -> None:
        """Close the run's ledger, if open."""
        if self.ledger is not None:
            self.ledger.close()

    def discard_scratch(self) -> None:
        """Delete the planning pass's scratch files (``InputPlan.scratch``): called when the
        run ends in this process, not when its plan is handed over to the flow."""
        release(self.plan.scratch)

    def report_facts(self) -> dict[str, Any]:
        """What the summary artifact adds to a recorded run's summary: its dead letters
        (ids and reasons, never text), chunk states and the price (USD per 1M tokens)."""
        ledger = self._ledger()
        return {
            "dead_letters": ledger.run_dead_letters(self.run_key),
            "chunk_states": ledger.state_counts(self.run_key),
            "price_per_million_tokens": self.settings.price_per_million_tokens,
        }

    @contextlib.contextmanager
    def recorded(self, *, flow_run_id: str | None) -> Iterator[None]:
        """Record the run ``running`` in its ledger (``open_ledger``) for the block.

        An error out of the block marks the run ``crashed``; an interrupt (Ctrl-C,
        SIGTERM: ``interrupt_of``) or a hard exit of the process ``interrupted``:
        nothing was lost, the rerun resumes.
        """
        ledger = self._ledger()
        hook = self.hard_stop_hook()
        STOP.exit.on_hard_exit(hook)
        try:
            ledger.start_run(
                self.run_key,
                self.plan,
                output_uri=self.store.uri,
                settings={
                    **self.settings.model_dump(),
                    "input": self.plan.source.path,
                    "output": self.store.uri,
                },
                flow_run_id=flow_run_id,
                object_uris=[self.store.uri_for(c.object_key) for c in self.plan.chunks],
            )
            yield
        except BaseException as exc:
            ledger.mark_stopped(
                self.run_key, status="crashed" if interrupt_of(exc) is None else "interrupted"
            )
            raise
        finally:
            STOP.exit.remove_hard_exit_hook(hook)

    @contextlib.contextmanager
    def leased(self) -> Iterator[str]:
        """Hold the run's lease in the store for the block (``tasks.lease.run_lease``): gc keeps
        the run's chunk objects, manifest, change set and paid requests while it is live,
        whatever its grace period; renewed every 5 min, dropped when the block ends. Yields
        the lease's first key (``flows.driver``: the wait for earlier runs).

        :raises EmbedlineError: the lease cannot be written (the store's error).
        """
        with run_lease(
            self.store,
            self.run_key,
            self.plan,
            model=self.settings.effective_model,
            dimensions=self.settings.dimensions,
            log=self.log,
        ) as key:
            yield key

    # ── work left ────────────────────────────────────────────────────────────────────────
    def check_store(self) -> None:
        """Check once per process that the store refuses to overwrite
        (docs/reference/output-layout.md).

        :raises RunStopped: it does not, and that is not allowed (the finished ``fatal``
            summary).
        """
        from tasks.publish.chunk_object import ensure_conditional_writes

        try:
            warning = ensure_conditional_writes(
                self.store, allow_unconditional=self.settings.allow_unconditional_store
            )
        except EmbedlineError as exc:
            self.stop(self.summary(exit_code=exc.exit_code, status="fatal", message=str(exc)))
        if warning:
            self.log.warning(warning)

    def work_left(self) -> Work:
        """The chunks published before (ledger, else the store), the dead letters this run
        retries (docs/reference/output-layout.md, "Generations") and the chunks left to embed.

        :raises RunStopped: an object at a chunk's key is something else (the finished
            ``fatal`` summary, exit 3).
        """
        settings, ledger = self.settings, self._ledger()
        try:
            skipped = find_published(
                self.plan,
                run_key=self.run_key,
                ledger=ledger,
                store=self.store,
                model=settings.effective_model,
            )
        except ConflictError as exc:
            self.stop(self.summary(exit_code=3, status="fatal", message=str(exc)))
        todo = [c for c in self.plan.chunks if c.index not in skipped]
        todo = sorted(todo + self._supersede(skipped), key=lambda c: c.index)
        self.log.info(
            "%d of %d chunks already published; %d to embed",
            len(skipped),
            len(self.plan.chunks),
            len(todo),
        )
        length = RunLength(pinned_length(self.store, settings.dimensions, self.target.supersedes))
        length.first_seen = self.learned_length
        return Work(skipped, todo, length)

    def needs_dispatch(self, work: Work) -> bool:
        """Whether ``work`` needs chunk tasks: chunks to embed, or published chunks whose
        vectors have another length than the run's (they are embedded again)."""
        return bool(work.todo) or self.redoes_lengths(work)

    def redoes_lengths(self, work: Work) -> bool:
        """Whether chunks published before this run (``work.skipped``) hold vectors of
        another length than the run's: they are embedded again (``flows.lengths``)."""
        if not work.skipped:
            return False
        done = with_lengths(self.store, work.skipped)
        return bool(other_lengths(done, work.length.decide(done.values())))

    def _supersede(self, skipped: dict[int, ChunkOutcome]) -> list[ChunkSpec]:
        """Published chunks whose dead letters this run retries (``retries_dead_letters``):
        taken out of ``skipped``, reopened in the ledger, and returned as specs of their next
        generation (docs/reference/output-layout.md, "Generations"), whose rows are reused from the
        published object but for the dead letters. Empty texts are never retried."""
        specs = []
        for index, outcome in sorted(skipped.items()):
            if retries_dead_letters(self.store, outcome, self.settings):
                generation = chunk_generation(outcome.object_key) + 1
                specs.append(replace(self.plan.chunks[index], generation=generation))
                self._ledger().reopen(self.run_key, index)
                del skipped[index]
        if specs:
            self.log.info("retrying the dead letters of %d published chunks", len(specs))
        return specs

    # ── conclude ─────────────────────────────────────────────────────────────────────────
    def conclude(
        self,
        work: Work,
        result: DispatchResult,
        *,
        cost: Usage | None = None,
        batches: int = 0,
        resume_hint: str = "rerun the same command to resume",
        on_committed: Callable[[RunSummary], None] | None = None,
    ) -> CommittedRun:
        """End the run after its dispatch: the summary of its outcomes, and when those allow
        it (every chunk published, no blocking dead letter unless ``allow_failed_rows``)
        the commit: objects still there, one vector length, change set and manifest (the
        commit point) with interrupts deferred until the ledger records it.

        ``cost``: the ``Usage`` of this process's chunk tasks, when known;
        ``batches``: the Batch API batches the dispatch used. ``on_committed`` runs inside
        the deferred block, after the ledger's record (the driver notes the commit for the
        signal handlers there). Returns ``CommittedRun`` with the manifest that stands.

        :raises RunStopped: nothing committed (chunks not published, blocking dead letters,
            objects deleted meanwhile, another vector length, a refused mass delete): the
            finished summary.
        """
        if self.ledger is not None:
            _record_calibration(self.ledger, self.settings, result)
        skipped = {**work.skipped, **result.published_elsewhere}
        fields = outcome_fields(
            self.plan,
            self.run_key,
            skipped,
            result,
            cost=cost,
            on_empty_text=self.settings.on_empty_text,
            resume_hint=resume_hint,
        )
        summary = self.summary(**with_inherited(fields, self.plan.delta))
        summary.batches = batches
        committable = summary.exit_code == 0 or (
            summary.status == "dead_letters" and self.settings.allow_failed_rows
        )
        if not committable:
            self.stop(summary)
        done = with_lengths(self.store, {**skipped, **result.published})
        delta = self.plan.delta
        off = other_lengths(done, delta.dimensions) if delta is not None else []
        if delta is not None and off:
            raise NightOfAnotherLength(int(done[off[0]].dimensions or 0), delta.dimensions)
        missing = missing_objects(self.store, done)
        if missing:
            self.stop(self._lost_objects(summary, missing))
        refused = work.length.refusal(done)  # the last check before the commit point
        if refused:
            self.stop(self.summary(summary, exit_code=1, status="incomplete", message=refused))
        with committing():
            try:
                committed = self._commit(done, summary, nothing_sent=not result.published)
            except MassDeleteError as exc:  # a cut-short export: nothing committed, all kept
                self.stop(
                    self.summary(
                        summary, exit_code=exc.exit_code, status="delete_refused", message=str(exc)
                    )
                )
            self.finish(committed.summary)
            if on_committed is not None:
                on_committed(committed.summary)
        return committed

    def _commit(
        self, done: dict[int, ChunkOutcome], summary: RunSummary, *, nothing_sent: bool
    ) -> CommittedRun:
        made = commit_run(
            self.store,
            settings=self.settings,
            plan=self.plan,
            run_key=self.run_key,
            done=done,
            rows_failed=summary.rows_failed,
            generation=summary.generation,
            supersedes=summary.supersedes,
        )
        changes = made.changes
        if self.ledger is not None:  # a delta night's empty texts: in no chunk
            record_unwritten_empties(self.ledger, self.plan, self.run_key)
        self.log.info(
            "manifest %s %s", "committed" if made.created else "already committed", made.uri
        )
        base = f"run {changes.base_run_key[:12]}" if changes.base_run_key else "nothing (first run)"
        self.log.info(
            "changes against %s: %s added, %s changed, %s removed, %s unchanged",
            base,
            *(
                f"{n:,}"
                for n in (changes.added, changes.changed, changes.removed, changes.unchanged)
            ),
        )
        message = "; ".join(
            filter(
                None,
                (
                    _NOTHING_SENT if nothing_sent else "",
                    committed_dead_letters_note(summary.rows_failed, summary.rows_empty),
                ),
            )
        )
        committed = self.summary(
            summary,
            **change_fields(made.manifest),
            exit_code=0,
            status="complete",
            manifest_uri=made.uri,
            dimensions=made.dimensions,
            message=message,
        )
        return CommittedRun(committed, made.manifest)

    def _lost_objects(self, summary: RunSummary, missing: list[str]) -> RunSummary:
        """Objects deleted under a running run (``embedline gc`` with a short grace period,
        or by hand): forget them, so the rerun embeds those chunks again; commit nothing."""
        self._ledger().forget_collected(
            self.store.uri,
            object_keys=missing,
            object_uris=[self.store.uri_for(k) for k in missing],
            manifest_uris=[],
        )
        return self.summary(
            summary,
            exit_code=1,
            status="incomplete",
            message=(
                f"{len(missing)} chunk objects were deleted from the output while the run went "
                "(embedline gc?); nothing committed: rerun the same command to embed them again"
            ),
        )

    def finish(self, summary: RunSummary) -> RunSummary:
        """Record ``summary``'s end of the run in the ledger (if recorded); return it."""
        if self.ledger is not None:
            committed = summary.status == "complete"
            self.ledger.finish_run(
                self.run_key,
                status=summary.status,
                rows_published=summary.rows_published,
                rows_failed=summary.rows_failed,
                manifest_uri=summary.manifest_uri,
                facts=run_payload(summary) if committed else None,
            )
        return summary

    def stop(self, summary: RunSummary) -> NoReturn:
        """End the run short of its commit: record ``summary`` (``finish``) and raise it.

        :raises RunStopped: always, carrying ``summary``.
        """
        raise RunStopped(self.finish(summary))

    def _ledger(self) -> Ledger:
        if self.ledger is None:
            raise RuntimeError("the run's ledger is not open: call Run.open_ledger() first")
        return self.ledger


def _refusal(plan: InputPlan, store: ObjectStore, exc: EmbedlineError, status: str) -> RunRefused:
    """The refusal of a run planned as ``plan`` that cannot start (``exc``): its scratch
    directory released, its summary saying ``status``, the error and the plan's totals."""
    release(plan.scratch)
    summary = Run.refused(
        exc.exit_code,
        status,
        str(exc),
        output=store.uri,
        rows_total=plan.rows,
        chunks_total=len(plan.chunks),
    )
    return RunRefused(summary)


def _record_calibration(ledger: Ledger, settings: RunSettings, result: DispatchResult) -> None:
    """Add what the server reported for the run's published chunks, and the estimate of the
    same texts, to the ledger's token calibration (``embedline.calibration``), whether or
    not the run then commits: the dry run's estimates learn from it."""
    published = result.published.values()
    estimated = sum(o.tokens_estimated for o in published)
    if settings.embedder != "openai" or not estimated:
        return
    ledger.add_calibration(
        settings.base_url,
        settings.effective_model,
        reported=sum(o.tokens for o in published if o.tokens_estimated),
        estimated=estimated,
    )
