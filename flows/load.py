"""The load stage: a committed run → a vector-store sink, resumable chunk by chunk
(docs/reference/sinks.md, "Loading").

Runs after the manifest commit inside ``embed-csv`` (``embedline run … --sink URI``) and as
its own flow ``load-run`` (``embedline load RUN --to URI``). Orchestration only:

1. open the sink, create its table if absent, refuse another model or length (exit 3);
2. read what the sink holds (every row's id and text hash) and the run's keys, and plan
   what takes the table to exactly the run (``tasks.load.sink_state``): nothing to do is
   ``already_loaded``; a plan deleting more than ``max_delete_fraction`` of the held rows
   stops here (exit 2, nothing written); mode ``changes`` when the plan is the run's change
   set (the sink holds its base run), else ``replace``;
3. one ``load-chunk-NNNN`` task per chunk with rows the sink lacks (only those rows);
4. the deletes, then read the sink again: a table another writer changed meanwhile gets
   the rest (at most three passes); then the index, and the ledger's cache is updated.

The ledger is never asked what the sink holds. A crash anywhere resumes on the next load:
what was committed to the sink is held, so it is not loaded again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture, wait
from prefect.states import Completed, Failed
from prefect.task_runners import ThreadPoolTaskRunner

from adapters.ledger import Ledger
from adapters.sinks.factory import open_alias
from embedline.errors import EmbedlineError
from embedline.models import LoadDeadLetter, ManifestChunk
from embedline.progress import PROGRESS_LOGGER
from embedline.protocols import VectorSink
from embedline.shutdown import STOP
from embedline.summary import LoadSummary, load_dead_letters_end
from embedline.tracebacks import quiet_expected_tracebacks
from flows.artifacts import publish_load_summary
from flows.cancellation import cancelled_or, complete_despite_cancel, run_stopping_on_cancel
from flows.events import emit_load_completed
from flows.interrupt_handlers import take_over_sigterm
from flows.load_index import index_stage
from tasks.embed.failures import status_for
from tasks.embed.task import store_for
from tasks.lease.load_lease import load_lease
from tasks.load.cutover import check_loaded, cut_over, cutover_target
from tasks.load.read_run import resolve_run
from tasks.load.sink_state import (
    DEFAULT_MAX_DELETE_FRACTION,
    LoadPlan,
    MassDeleteError,
    check_delete_share,
    ensure_run_table,
    left_to_load,
    load_mode,
    plan_load,
)
from tasks.load.task import LoadedChunk, LoadJob, load_chunk, release_sink, sink_for

__all__ = ["load_run", "load_stage"]

logging.getLogger(PROGRESS_LOGGER).setLevel(logging.INFO)  # a sink's progress lines show


@flow(name="load-run", log_prints=False)
def load_run(
    to: str,
    run: str | None = None,
    output: str = "./embedline-output",
    ledger: str = ".embedline/ledger.sqlite3",
    max_delete_fraction: float = DEFAULT_MAX_DELETE_FRACTION,
    allow_failed_rows: bool = False,
    lancedb_keep_versions_s: float | None = None,
    alias: str | None = None,
    index: Literal["now", "later"] = "now",
) -> State[Any]:
    """Load committed run ``run`` (key or ≥ 8-hex prefix; default the latest) of ``output``
    into the sink ``to``; refuse (exit 2) to delete more than ``max_delete_fraction`` (0..1)
    of the rows the sink holds. Returns a Completed or Failed state carrying the
    ``LoadSummary``. With ``alias``, the model cutover (``tasks.load.cutover``): the run goes into
    the table of its model behind ``alias`` in the store ``to`` names, is checked, and
    only then ``alias`` is switched to it (a failed check exits 3, switching nothing).

    ``allow_failed_rows``: rows the sink refuses for good (load dead letters) do not make
    the load fail (exit 0). ``lancedb_keep_versions_s``: LanceDB versions older than this
    (seconds) are pruned after the load (default 3,600). ``index`` ``later``: the sink's
    index is not built (``embedline index TARGET`` builds it); the summary says so."""
    quiet_expected_tracebacks()  # a lost sink is a line, not a traceback
    take_over_sigterm()  # run by the CLI: its SIGTERM handling, not Prefect's
    started = time.monotonic()
    try:
        manifest = resolve_run(store_for(output), run)
    except EmbedlineError as exc:
        return final_state(LoadSummary(exc.exit_code, "input_error", str(exc), sink=to))
    try:
        target = to if alias is None else cutover_target(to, alias, manifest)
    except EmbedlineError as exc:
        return final_state(LoadSummary(exc.exit_code, "input_error", str(exc), sink=to))
    book = Ledger(ledger)
    try:
        summary = run_stopping_on_cancel(
            lambda: load_stage(
                output=output,
                manifest=manifest,
                sink_uri=target,
                ledger=book,
                max_delete_fraction=max_delete_fraction,
                allow_failed_rows=allow_failed_rows,
                keep_versions_s=lancedb_keep_versions_s,
                index=index,
            )
        )
    finally:
        book.close()
    if isinstance(summary, State):  # cancelled from Prefect (the CLI's process)
        return summary
    if alias is not None and summary.exit_code == 0:
        summary = switch_alias(summary, to=to, alias=alias, target=target, manifest=manifest)
    summary.wall_s = round(time.monotonic() - started, 3)
    if STOP.report.api_lost() is None:
        publish_load_summary(summary)
    return final_state(summary)


def final_state(summary: LoadSummary) -> State[Any]:
    """Completed (exit 0) or Failed, carrying the summary dict."""
    if summary.exit_code == 0:
        complete_despite_cancel()  # a cancel that came as the load ended stopped nothing
        return Completed(message=summary.message or summary.status, data=summary.to_dict())
    return cancelled_or(Failed(message=summary.message, data=LoadNotComplete(summary.to_dict())))


class LoadNotComplete(Exception):
    """The data of a Failed ``load-run`` state (Prefect re-raises a failed run's data)."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(summary["message"])
        self.summary = summary


def load_stage(
    *,
    output: str,
    manifest: dict[str, Any],
    sink_uri: str,
    ledger: Ledger,
    max_delete_fraction: float = DEFAULT_MAX_DELETE_FRACTION,
    allow_failed_rows: bool = False,
    keep_versions_s: float | None = None,
    on_stage: Callable[[str, str], None] | None = None,
    index: Literal["now", "later"] = "now",
) -> LoadSummary:
    """Load the run of ``manifest`` (published under ``output``) into ``sink_uri``: take the
    table to exactly the run's rows, decided by what the sink holds (``tasks.load.sink_state``).

    A load that would delete more than ``max_delete_fraction`` (0..1) of the rows the sink
    held stops before writing anything (exit 2). Call inside a flow run. Never raises for an
    expected failure: the summary says it. Holds a load lease on the run for its whole
    length, so gc keeps what it reads. Rows the sink refuses for good are load dead
    letters: the rest is loaded and the load finishes; the summary says ``dead_letters``,
    exit 1, unless ``allow_failed_rows``. ``keep_versions_s``: see ``load_run``. A load that
    changed the sink and ended with exit 0 emits ``embedline.load.completed``. The index
    is built last, in its own ``build-index`` task run (``tasks.load.task.build_index``),
    unless ``index`` is ``later``; a sink holding the run's rows but not its index
    (``VectorSink.needs_index``) gets it built, status ``loaded``, not ``already_loaded``.
    ``on_stage`` receives the load's progress as it goes (``("load", phrase)`` after each
    wave of chunks, ``("index", phrase)`` around the index build): the progress artifact's
    own lines.
    """
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(load_lease(store_for(output), manifest, log=get_run_logger()))
        except EmbedlineError as exc:  # no lease gc respects: nothing was read
            status = "fatal" if exc.exit_code == 3 else "failed"
            return LoadSummary(
                exc.exit_code,
                status,
                f"{exc} (writing the load lease)",
                sink=sink_uri,
                run_key=str(manifest["run_key"]),
            )
        options = _Options(
            max_delete_fraction, allow_failed_rows, keep_versions_s, index, on_stage=on_stage
        )
        held.callback(release_sink, sink_uri)  # when the stage ends, before the lease goes
        summary = _load_stage(
            output=output, manifest=manifest, sink_uri=sink_uri, ledger=ledger, options=options
        )
    if summary.exit_code == 0 and summary.status != "already_loaded":
        emit_load_completed(summary)
    return summary


def _load_stage(
    *,
    output: str,
    manifest: dict[str, Any],
    sink_uri: str,
    ledger: Ledger,
    options: _Options,
) -> LoadSummary:
    logger = get_run_logger()
    started = time.monotonic()
    run_key = str(manifest["run_key"])
    chunks = [ManifestChunk.from_dict(e) for e in manifest["chunks"]]
    base = LoadSummary(0, "loading", "", sink=sink_uri, run_key=run_key, chunks_total=len(chunks))
    try:
        sink = sink_for(sink_uri)
        columns = ensure_run_table(sink, manifest)
    except EmbedlineError as exc:
        return _with(
            base,
            started,
            exit_code=exc.exit_code,
            status="fatal" if exc.exit_code == 3 else "failed",
            message=str(exc),
        )
    base.sink = sink.identity
    try:
        run, plan = left_to_load(store_for(output), manifest, sink, columns)
        mode = load_mode(store_for(output), manifest, plan)
    except EmbedlineError as exc:
        return _with(
            base,
            started,
            exit_code=exc.exit_code,
            status="fatal" if exc.exit_code == 3 else "failed",
            message=str(exc),
        )
    except FileNotFoundError as exc:  # gc, or by hand: the run can no longer be loaded
        return _with(
            base,
            started,
            exit_code=3,
            status="fatal",
            message=(
                f"a chunk object of run {run_key[:12]} is gone from {output} ({exc.filename}): "
                "load a newer run"
            ),
        )
    total = sum(c.rows for c in chunks)
    base = _with(
        base,
        started,
        mode=mode,
        rows_skipped=total - plan.rows_to_upsert,
        chunks_skipped=len(chunks) - len(plan.upsert),
    )
    if plan.done:
        logger.info("%s holds exactly run %s (%d rows)", sink.identity, run_key, total)
        cached = ledger.sink_load(sink.identity, run_key)
        try:
            # the index is part of what the sink holds: one missing (a build cancelled, or
            # deferred) is built now
            missing = options.index == "now" and sink.needs_index()
            if missing or cached is None or cached.state != "loaded":  # killed before its index
                base = index_stage(base, sink, options.index, options.keep_versions_s, options.show)
        except EmbedlineError as exc:
            return _with(
                base,
                started,
                exit_code=exc.exit_code if exc.exit_code == 3 else 1,
                status="incomplete",
                message=f"{exc}; rerun the same command",
            )
        ledger.start_load(sink.identity, run_key, mode=mode)
        ledger.finish_load(sink.identity, run_key, rows_loaded=total, rows_deleted=0)
        if missing:
            return _with(
                base,
                started,
                status="loaded",
                message="the sink held the run's rows but not its index: index built",
            )
        return _with(
            base,
            started,
            status="already_loaded",
            message="the sink already holds exactly this run",
        )
    try:
        check_delete_share(
            len(plan.delete),
            plan.held,
            options.max_delete_fraction,
            what=f"loading run {run_key[:12]} into {sink.identity}",
        )
    except MassDeleteError as exc:
        logger.error("%s", exc)
        return _with(
            base, started, exit_code=exc.exit_code, status="delete_refused", message=str(exc)
        )
    ledger.start_load(sink.identity, run_key, mode=mode)
    logger.info(
        "loading run %s into %s (%s): %d rows of %d chunks to upsert, %d ids to "
        "delete, %d of %d chunks already held",
        run_key,
        sink.identity,
        mode,
        plan.rows_to_upsert,
        len(plan.upsert),
        len(plan.delete),
        len(chunks) - len(plan.upsert),
        len(chunks),
    )
    options = replace(options, columns=columns.names)
    options.show(
        "load",
        f"0 of {plan.rows_to_upsert:,} rows upserted, 0 of {len(plan.upsert):,} chunks, "
        f"{len(plan.delete):,} ids to delete",
    )
    return _converge(base, started, chunks, run, plan, sink, ledger, output, options)


@dataclass(frozen=True, slots=True)
class _Options:
    """A load's user options: the mass-delete guard (0..1 of the held rows), whether load
    dead letters still exit 0, LanceDB's version retention (seconds; None: default), when
    the index is built; and the columns the run carries beside its vectors (from its
    manifest)."""

    max_delete_fraction: float
    allow_failed_rows: bool
    keep_versions_s: float | None
    index: Literal["now", "later"] = "now"
    columns: tuple[str, ...] = ()  # the run's kept columns and text, read with each chunk
    on_stage: Callable[[str, str], None] | None = None  # progress lines: (stage, phrase)

    def show(self, stage: str, phrase: str) -> None:
        """Send a progress line of ``stage`` (``load``, ``index``) to ``on_stage``, if any."""
        if self.on_stage is not None:
            self.on_stage(stage, phrase)


_PASSES = 3  # plans applied before a table that keeps changing under the load is reported


def _converge(
    summary: LoadSummary,
    started: float,
    chunks: list[ManifestChunk],
    run: pa.Table,
    plan: LoadPlan,
    sink: VectorSink,
    ledger: Ledger,
    output: str,
    options: _Options,
) -> LoadSummary:
    """Apply ``plan``, read what the sink holds again, and repeat until it holds exactly the
    run (another writer may have written meanwhile), at most ``_PASSES`` times. Rows the
    sink refused for good (load dead letters) are left out of the run from then on: the
    sink can never hold them, so they are listed, not loaded again in the next pass."""
    run_key = str(summary.run_key)
    dead: list[LoadDeadLetter] = []
    held_before = plan.held
    by_index = {c.index: c for c in chunks}
    for _ in range(_PASSES):
        todo = [by_index[i] for i in plan.upsert]
        ids = {i: (None if len(v) == by_index[i].rows else v) for i, v in plan.upsert.items()}
        job = LoadJob(
            output=output,
            sink=sink.identity,
            run_key=run_key,
            mode=str(summary.mode),
            columns=options.columns,
        )
        loaded, failed, refused = _load_chunks(todo, job, sink, ledger, ids, options.show)
        if refused:
            dead += refused
            run = run.filter(
                pc.invert(
                    pc.is_in(run.column("id"), pa.array([d.id for d in refused], pa.string()))
                )
            )
        summary = _with(
            summary,
            started,
            rows_loaded=summary.rows_loaded + sum(loaded.values()),
            chunks_loaded=summary.chunks_loaded + len(loaded),
            chunks_failed=len(failed),
        )
        if failed:
            fatal = [f for f in failed.values() if f.kind == "fatal"]
            first = (fatal or list(failed.values()))[0]
            return _with(
                summary,
                started,
                exit_code=3 if fatal else 1,
                status="incomplete",
                message=f"{len(todo) - len(loaded)} of {len(chunks)} chunks not loaded "
                f"({first.error}); rerun the same command to load only "
                "those",
            )
        try:
            if plan.delete:
                check_delete_share(
                    len(plan.delete),
                    held_before,
                    options.max_delete_fraction,
                    what=f"loading run {run_key[:12]} into {sink.identity}",
                )
                summary = _with(
                    summary,
                    started,
                    rows_deleted=summary.rows_deleted + sink.delete_ids(plan.delete),
                )
            plan = plan_load(run, sink.held_keys())
            if plan.done:
                summary = index_stage(
                    summary, sink, options.index, options.keep_versions_s, options.show
                )
                break
        except MassDeleteError as exc:
            return _with(
                summary, started, exit_code=exc.exit_code, status="delete_refused", message=str(exc)
            )
        except EmbedlineError as exc:
            return _with(
                summary,
                started,
                exit_code=exc.exit_code if exc.exit_code == 3 else 1,
                status="incomplete",
                message=f"{exc}; rerun the same command to finish",
            )
        get_run_logger().warning(
            "%s changed while loading (another load writing it?): %d rows "
            "to upsert and %d ids to delete again",
            sink.identity,
            plan.rows_to_upsert,
            len(plan.delete),
        )
    else:
        return _with(
            summary,
            started,
            exit_code=1,
            status="incomplete",
            message=(
                f"{sink.identity} kept changing while run {run_key[:12]} was loaded (another load "
                f"writing the same table?); rerun the same command once that one has finished"
            ),
        )
    ledger.finish_load(
        sink.identity, run_key, rows_loaded=summary.rows_loaded, rows_deleted=summary.rows_deleted
    )
    if dead:
        _dead_letters_artifact(dead)
    return load_dead_letters_end(
        _with(summary, started, status="loaded"), dead, options.allow_failed_rows
    )


def _dead_letters_artifact(dead: list[LoadDeadLetter]) -> None:
    """The ``embedline-load-dead-letters`` table artifact (ids and reasons, never text)."""
    if STOP.report.api_lost() is not None:
        return
    create_table_artifact(
        [
            {
                "chunk": d.chunk_index,
                "id": d.id[:200],
                "reason": d.reason,
                "sqlstate": d.sqlstate,
                "message": d.message,
            }
            for d in dead[:1000]
        ],
        key="embedline-load-dead-letters",
        description=f"{len(dead)} rows the sink refuses (no text)",
    )


def _load_chunks(
    todo: list[ManifestChunk],
    job: LoadJob,
    sink: VectorSink,
    ledger: Ledger,
    ids: dict[int, frozenset[str] | None],
    show: Callable[[str, str], None],
) -> tuple[dict[int, int], dict[int, Any], list[LoadDeadLetter]]:
    """Run ``load-chunk`` tasks, ``sink.parallel_loads`` at a time; record each in the
    ledger as it finishes, with the rows the sink refused for good, and ``show`` the rows
    upserted after each wave. Stops submitting after a fatal failure, and after a wave the
    sink took none of (it is unreachable: a circuit breaker, as the embedder's). Returns
    rows loaded and failures by chunk index (chunks never sent are in neither), and the
    refused rows."""
    to_upsert = sum(c.rows if ids[c.index] is None else len(ids[c.index] or ()) for c in todo)
    logger = get_run_logger()
    loaded: dict[int, int] = {}
    failed: dict[int, Any] = {}
    refused: list[LoadDeadLetter] = []
    window = max(1, sink.parallel_loads)
    pool: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=window)
    with pool as runner:
        for start in range(0, len(todo), window):
            wave = todo[start : start + window]
            futures: list[PrefectFuture[Any]] = [
                runner.submit(load_chunk, {"chunk": c, "job": job, "ids": ids[c.index]})
                for c in wave
            ]
            wait(futures)
            for chunk, future in zip(wave, futures, strict=True):
                state = future.state
                if not state.is_completed():
                    exc = state.result(raise_on_failure=False)
                    failed[chunk.index] = status_for(
                        exc
                        if isinstance(exc, BaseException)
                        else RuntimeError(f"state {state.type.value}")
                    )
                    logger.error("chunk %d not loaded: %s", chunk.index, failed[chunk.index].error)
                    continue
                done: LoadedChunk = future.result()
                ledger.mark_chunk_loaded(
                    job.sink,
                    job.run_key,
                    chunk.index,
                    chunk_key=chunk.key,
                    rows=done.rows,
                    dead_letters=done.dead_letters,
                )
                loaded[chunk.index] = done.rows
                refused += done.dead_letters
            show(
                "load",
                f"{sum(loaded.values()):,} of {to_upsert:,} rows upserted, {len(loaded):,} of "
                f"{len(todo):,} chunks" + (f", {len(failed):,} failed" if failed else ""),
            )
            if any(f.kind == "fatal" for f in failed.values()):
                break
            if not any(c.index in loaded for c in wave) and start + window < len(todo):
                # the sink took none of a whole wave: it is gone (a server stopped, a lost
                # network), and the other chunks would each fail the same way, each logged
                logger.warning(
                    "the sink took none of the last %d chunks: the other %d are not sent",
                    len(wave),
                    len(todo) - start - len(wave),
                )
                break
    return loaded, failed, refused


def _with(summary: LoadSummary, started: float, **changes: Any) -> LoadSummary:
    fields: dict[str, Any] = {**changes, "wall_s": round(time.monotonic() - started, 3)}
    return replace(summary, **fields)


def switch_alias(
    summary: LoadSummary, *, to: str, alias: str, target: str, manifest: dict[str, Any]
) -> LoadSummary:
    """After a load into ``target`` that ended with exit 0: check the table against the
    manifest and switch ``alias`` to it; the summary says what was switched, or exit 3
    (``cutover_refused``) with the alias untouched."""
    sink = sink_for(target)
    try:
        check_loaded(sink, manifest)
        switch = open_alias(to, alias, via=sink)
        done = cut_over(switch, sink.table_name)
    except EmbedlineError as exc:
        return replace(
            summary,
            exit_code=exc.exit_code,
            status="cutover_refused",
            message=str(exc),
            alias=alias,
        )
    get_run_logger().info(
        "alias %s -> %s (%s)",
        alias,
        done.table,
        f"was {done.previous}"
        if done.switched and done.previous
        else "new"
        if done.switched
        else "already there",
    )
    return replace(summary, alias=alias, alias_table=done.table, alias_previous=done.previous)
