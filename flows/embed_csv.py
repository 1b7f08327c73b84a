"""The ``embed-csv`` flow: plan → skip published → embed + publish chunks → manifest.

Orchestration only. Parameters mirror ``embedline run`` (DESIGN §3) and never include a
secret: the API key stays in the environment. The flow's final state is Completed when the
manifest is committed (or already was), Failed otherwise; its data is the run summary, whose
``exit_code`` the CLI returns.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import replace
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.blocks.system import Secret
from prefect.runtime import flow_run
from prefect.settings import get_current_settings
from prefect.states import Completed, Failed, State
from pydantic import ValidationError

from adapters.embeddings import api_key_from_env, close_embedders
from adapters.ledger import Ledger, new_owner, record_hard_stop
from embedline import shutdown
from embedline.errors import ConflictError, DiskFullError, EmbedlineError, InputError
from embedline.models import (
    ChunkOutcome,
    InputPlan,
    RunSummary,
    blocking_dead_letters,
    chunk_generation,
    committed_dead_letters_note,
    dead_letters_block_message,
    manifest_object_key,
)
from embedline.progress import cost_in_process, reset_cost
from embedline.settings import NO_API_KEY_MESSAGE, RunSettings, validation_message
from embedline.tracebacks import quiet_expected_tracebacks
from flows import cancellation
from flows.dispatch import DispatchResult, Dispatcher
from flows.lengths import redo_other_lengths
from flows.disk_full import disk_full_summary
from flows.progress_report import progress_reporter
from flows.load import load_stage
from flows.signals import dispatch_with_graceful_stop, under_prefect_runner
from flows.task_runner import task_runner, warm_up
from tasks.chunk import embed_chunk, show_published_chunk, store_for
from tasks.commit import commit_run, ledger_catches_up, missing_objects
from tasks.dimensions import RunLength, pinned_length, with_lengths
from tasks.gc import drop_run_lease, write_run_lease
from tasks.generations import resolve_run_target
from tasks.manifest import change_fields, summary_from_manifest
from tasks.plan import find_published, plan_input
from tasks.publish import ensure_conditional_writes
from tasks.published import retries_dead_letters
from tasks.report import ProgressArtifact, publish_summary
from tasks.reuse import ReusePlanner, refresh_index
from tasks.sink_state import MassDeleteError

__all__ = ["embed_csv", "run_settings"]


@flow(name="embed-csv", log_prints=False)
def embed_csv(
    input: str,
    output: str = "./embedline-output",
    id_column: str = "id",
    text_column: str = "text",
    encoding: str = "auto",
    delimiter: str = "auto",
    embedder: Literal["local", "openai"] = "local",
    model: str | None = None,
    base_url: str = "https://api.openai.com/v1",
    dimensions: int | None = None,
    chunk_size: int = 1000,
    batch_size: int = 128,
    max_request_tokens: int = 200_000,
    concurrency: int = 8,
    rpm: int | None = None,
    tpm: int | None = None,
    timeout: float = 60.0,
    max_attempts: int = 6,
    max_input_tokens: int | None = None,
    on_too_long: Literal["dead-letter", "truncate"] = "dead-letter",
    auth_header: str | None = None,
    encoding_format: Literal["auto", "base64", "float"] = "auto",
    chunk_retries: int = 1,
    chunk_retry_delay: float = 10.0,
    grace: float = 30.0,
    ledger: str = ".embedline/ledger.sqlite3",
    allow_failed_rows: bool = False,
    on_empty_text: Literal["skip", "fail"] = "skip",
    retry_dead_letters: bool = False,
    allow_unconditional_store: bool = False,
    price_per_million_tokens: float | None = None,
    reuse: bool = True,
    task_runner: Literal["threads", "dask"] = "threads",
    dask_address: str | None = None,
    dask_workers: int = 2,
    sink: str | None = None,
    max_delete_fraction: float = 0.5,
) -> State[Any]:
    """Embed the ``text_column`` of the CSV at ``input`` and publish it under ``output``.

    With ``sink``, the committed run is then loaded into that vector store (``load-chunk``
    tasks; DESIGN §9); ``max_delete_fraction``: DESIGN §9, "Mass deletes". Units:
    ``chunk_size``/``batch_size`` rows, ``concurrency`` in-flight requests, ``rpm``
    requests/min, ``tpm`` tokens/min, ``timeout`` seconds per request, ``max_attempts`` per
    request (first try included). Returns a Completed or Failed state carrying the summary
    (Cancelled if cancelled from Prefect: ``flows.cancellation``).
    """
    quiet_expected_tracebacks()
    try:
        settings = RunSettings.from_parameters(dict(locals()))
    except ValidationError as exc:
        return _final(RunSummary(2, "input_error",
                                 f"invalid parameters: {validation_message(exc)}"))
    if settings.embedder == "openai" and api_key_from_env() is None:
        problem = _export_api_key_from_block()
        if problem:
            return _final(RunSummary(3, "fatal", problem))
        if settings.requires_api_key and api_key_from_env() is None:
            return _final(RunSummary(3, "fatal", NO_API_KEY_MESSAGE))
    summary = cancellation.run_stopping_on_cancel(lambda: run_settings(settings))
    if isinstance(summary, State):  # cancelled from Prefect before the run had a summary
        return summary
    cancellation.end_as_runner_cancellation(summary.message)
    # The Prefect API went away: the CLI prints this and exits (not 1 min of client retries)
    shutdown.hand_over(summary.to_dict())
    return _final(summary)


#: Secret block read when neither EMBEDLINE_API_KEY nor OPENAI_API_KEY is set.
API_KEY_BLOCK_ENV, DEFAULT_API_KEY_BLOCK = "EMBEDLINE_API_KEY_BLOCK", "embedline-api-key"


def _export_api_key_from_block() -> str | None:
    """Copy the key from a Prefect ``Secret`` block into this process's EMBEDLINE_API_KEY.

    The block is named by ``$EMBEDLINE_API_KEY_BLOCK``, else ``embedline-api-key``; a missing
    default block just leaves the key unset (the adapter warns). The value is never logged.
    Returns a message if the block named by the variable is missing or holds no string.
    """
    named = os.environ.get(API_KEY_BLOCK_ENV)
    name = named or DEFAULT_API_KEY_BLOCK
    try:
        value = Secret.load(name).get()
    except ValueError:
        return f"no Secret block named {name!r} (from {API_KEY_BLOCK_ENV})" if named else None
    if not isinstance(value, str) or not value.strip():
        return f"the Secret block {name!r} holds no API key string"
    os.environ["EMBEDLINE_API_KEY"] = value.strip()
    get_run_logger().info("API key loaded from Secret block %r", name)
    return None


def run_settings(settings: RunSettings) -> RunSummary:
    """Run the pipeline for ``settings`` inside the current flow run; return its summary."""
    shutdown.take_over_sigterm()  # run by the CLI: its SIGTERM handling, not Prefect's
    logger = get_run_logger()
    started = time.monotonic()
    # ── plan ──────────────────────────────────────────────────────────────────────────────
    try:
        store = store_for(settings.output)
        store.prepare()  # a local directory: create it, or say why not
        plan = plan_input(settings)
    except InputError as exc:
        return RunSummary(exc.exit_code, "input_error", str(exc))
    # ── already committed, or a retry of a committed run's dead letters? ─────────────────
    try:
        target = resolve_run_target(store, plan, settings)
    except EmbedlineError as exc:
        return RunSummary(exc.exit_code, "fatal", str(exc), output=store.uri,
                          rows_total=plan.rows, chunks_total=len(plan.chunks))  # fmt: skip
    run_key = target.run_key
    if target.committed is not None:
        uri = store.uri_for(manifest_object_key(run_key))
        logger.info("run %s is already complete: manifest %s", run_key, uri)
        if ledger_catches_up(settings.ledger, target.committed, uri):
            logger.info("the ledger now records run %s as complete, as the store does",
                        run_key)  # fmt: skip
        return _load_into_sink(settings, target.committed, summary_from_manifest(
            target.committed, uri=uri, output=store.uri, chunks_total=len(plan.chunks),
            wall_s=time.monotonic() - started))  # fmt: skip
    if target.supersedes:
        logger.info("run %s is committed with dead letters to retry: committing generation "
                    "%d as run %s", target.supersedes, target.generation, run_key)  # fmt: skip
    base = RunSummary(0, "running", "", run_key=run_key, output=store.uri, rows_total=plan.rows,
                      chunks_total=len(plan.chunks), generation=target.generation,
                      supersedes=target.supersedes,
                      price_per_million_tokens=settings.price_per_million_tokens)  # fmt: skip
    try:
        ledger = Ledger(settings.ledger)
    except DiskFullError as exc:  # exit 1, one line; nothing started
        return _with(base, started, exit_code=exc.exit_code, status="disk_full", message=str(exc))
    try:
        try:
            summary = _run_recording_crashes(settings, plan, base, ledger, started)
        except DiskFullError as exc:  # the ledger mid-run: what is published stays published
            return disk_full_summary(exc, base, plan, store, settings, started)
        if shutdown.api_lost() is not None:
            return summary  # no artifact: each call would retry for a minute
        publish_summary(
            summary, dead_letters=ledger.run_dead_letters(run_key),
            chunk_states=ledger.state_counts(run_key),
            price_per_million_tokens=settings.price_per_million_tokens,
        )  # fmt: skip
        return summary
    finally:
        ledger.close()
        close_embedders()  # a latched (fatal) client must not outlive its run


def _run_recording_crashes(
    settings: RunSettings, plan: InputPlan, base: RunSummary, ledger: Ledger, started: float
) -> RunSummary:
    """``_run``, but a run that dies of an unexpected error is marked ``crashed`` in the
    ledger (not left ``running``) before the error propagates to Prefect; one ended by an
    interrupt before dispatching (Ctrl-C, SIGTERM: ``shutdown.is_interrupt``) or by a hard
    exit of this process (a second signal; the Prefect API lost before chunks were
    dispatched) is marked ``interrupted``: nothing was lost, the rerun resumes."""
    on_hard_exit = functools.partial(record_hard_stop, settings.ledger, str(base.run_key))
    shutdown.on_hard_exit(on_hard_exit)
    try:
        return _run(settings, plan, base, ledger, started)
    except BaseException as exc:
        ledger.mark_stopped(str(base.run_key),
                            status="interrupted" if shutdown.is_interrupt(exc) else "crashed")
        raise
    finally:
        shutdown.remove_hard_exit_hook(on_hard_exit)


def _run(
    settings: RunSettings, plan: InputPlan, base: RunSummary, ledger: Ledger, started: float
) -> RunSummary:
    logger = get_run_logger()
    store = store_for(settings.output)
    run_key = str(base.run_key)
    ledger.start_run(
        run_key, plan, output_uri=store.uri,
        settings={**settings.model_dump(), "input": plan.source.path, "output": store.uri},
        flow_run_id=flow_run.get_id(),
        object_uris=[store.uri_for(c.object_key) for c in plan.chunks],
    )  # fmt: skip
    # ── store check, then skip published ─────────────────────────────────────────────────
    try:
        warning = ensure_conditional_writes(
            store, allow_unconditional=settings.allow_unconditional_store
        )
    except EmbedlineError as exc:
        return _finish(ledger, _with(base, started, exit_code=exc.exit_code, status="fatal",
                                     message=str(exc)))  # fmt: skip
    if warning:
        logger.warning(warning)
    lease = write_run_lease(store, run_key, new_owner(), plan)  # gc keeps what it lists
    try:
        return _embed_and_commit(settings, plan, base, ledger, started, store)
    finally:
        try:
            drop_run_lease(store, lease)
        except EmbedlineError as exc:
            logger.warning("could not delete the run lease %s: %s", lease, exc)


def _embed_and_commit(settings: RunSettings, plan: InputPlan, base: RunSummary,
                      ledger: Ledger, started: float, store: Any) -> RunSummary:  # fmt: skip
    logger = get_run_logger()
    run_key = str(base.run_key)
    try:
        skipped = find_published(plan, run_key=run_key, ledger=ledger, store=store,
                                 model=settings.effective_model)  # fmt: skip
    except ConflictError as exc:
        return _finish(ledger, _with(base, started, exit_code=3, status="fatal",
                                     message=str(exc)))  # fmt: skip
    todo = [c for c in plan.chunks if c.index not in skipped]
    retry = _supersede(ledger, run_key, plan, skipped, store, settings)
    todo = sorted(todo + retry, key=lambda c: c.index)
    logger.info("%d of %d chunks already published; %d to embed",
                len(skipped), len(plan.chunks), len(todo))  # fmt: skip
    planner = _reuse_planner(settings, plan, store, ledger, todo)
    length = RunLength(pinned_length(store, settings.dimensions, base.supersedes))  # DESIGN §5
    # ── embed + publish, record as chunks finish ─────────────────────────────────────────
    artifact = ProgressArtifact(description=f"{plan.source.name}: rows embedded and published")
    report = progress_reporter(plan, skipped, artifact)
    report(DispatchResult())
    window = 2 if settings.embedder == "local" else settings.concurrency + 1
    chunk_task = embed_chunk.with_options(
        retries=settings.chunk_retries,
        retry_delay_seconds=settings.chunk_retry_delay_s,
        retry_jitter_factor=0.5 if settings.chunk_retry_delay_s else None,
    )
    shutdown.reset()
    reset_cost()
    runner_started = time.monotonic()
    with task_runner(settings, window) as runner:
        warm_up(runner, settings, logger, since=runner_started)
        dispatcher = Dispatcher(
            ledger=ledger,
            run_key=run_key,
            object_uri=lambda spec: store.uri_for(spec.object_key),
            submit=lambda spec: runner.submit(
                chunk_task, {"spec": spec, "source": plan.source, "settings": settings,
                             "reuse": planner.resolve(spec), "dimensions": length.current()}
            ),
            window=window,
            logger=logger,
            on_outcome=lambda result: (length.answered(result.published.values()),
                                       report(result)),
            on_tick=report,
            on_gave_up=planner.note_failed,
            grace_s=settings.grace_s,
        )
        _show_published(runner, plan, skipped, store)
        shutdown.expect_hand_over()
        result = dispatch_with_graceful_stop(dispatcher, todo, grace_s=settings.grace_s,
                                             logger=logger)
        redo_other_lengths(dispatcher, store=store, plan=plan, skipped=skipped, length=length,
                           grace_s=settings.grace_s, logger=logger)
    artifact.close()
    # ── manifest ─────────────────────────────────────────────────────────────────────────
    skipped = {**skipped, **result.published_elsewhere}
    # threads: every request the chunk tasks sent (failed, retried and released attempts
    # too); Dask workers count in their own processes, so there the outcomes' counts
    cost = cost_in_process() if settings.task_runner == "threads" else None
    summary = _summarize(base, plan, skipped, result, started, cost=cost,
                         on_empty_text=settings.on_empty_text)
    if summary.exit_code == 0 or (summary.status == "dead_letters" and settings.allow_failed_rows):
        done = with_lengths(store, {**skipped, **result.published})
        missing = missing_objects(store, done)
        if missing:
            return _finish(ledger, _lost_objects(ledger, store, summary, started, missing))
        refused = length.refusal(done)  # the last check before the commit point
        if refused:
            return _finish(ledger, _with(summary, started, exit_code=1, status="incomplete",
                                         message=refused))
        # The manifest's PUT is the commit point: an interrupt waits until the ledger says so
        with shutdown.interrupts_deferred():
            try:
                summary, manifest = _commit(settings, plan, store, done, summary)
            except MassDeleteError as exc:  # a cut-short export: nothing committed, all kept
                return _finish(ledger, _with(summary, started, exit_code=exc.exit_code,
                                             status="delete_refused", message=str(exc)))
            summary = _finish(ledger, summary)
            shutdown.note_committed(run_key, str(summary.manifest_uri), (
                "rerun the same command to load it into the sink" if settings.sink
                else "nothing to resume"), None if settings.sink else summary.to_dict())
            if not settings.sink:
                shutdown.note_finishing()
        # ── load into the sink ───────────────────────────────────────────────────────────
        return _load_into_sink(settings, manifest, summary, ledger)
    return _finish(ledger, summary)


def _supersede(ledger: Ledger, run_key: str, plan: InputPlan, skipped: dict[int, ChunkOutcome],
               store: Any, settings: RunSettings) -> list[Any]:  # fmt: skip
    """Published chunks whose dead letters this run retries (``retries_dead_letters``): taken
    out of ``skipped``, reopened in the ledger, and returned as specs of their next
    generation (DESIGN §8), whose rows are reused from the published object but for the
    dead letters. Empty texts are never retried."""
    specs = []
    for index, outcome in sorted(skipped.items()):
        if retries_dead_letters(store, outcome, settings):
            generation = chunk_generation(outcome.object_key) + 1
            specs.append(replace(plan.chunks[index], generation=generation))
            ledger.reopen(run_key, index)
            del skipped[index]
    if specs:
        get_run_logger().info("retrying the dead letters of %d published chunks", len(specs))
    return specs


def _lost_objects(ledger: Ledger, store: Any, base: RunSummary, started: float,
                  missing: list[str]) -> RunSummary:  # fmt: skip
    """Objects deleted under a running run (``embedline gc`` with a short grace period, or
    by hand): forget them, so the rerun embeds those chunks again; commit nothing."""
    ledger.forget_collected(store.uri, object_keys=missing,
                            object_uris=[store.uri_for(k) for k in missing],
                            manifest_uris=[])  # fmt: skip
    return _with(base, started, exit_code=1, status="incomplete", message=(
        f"{len(missing)} chunk objects were deleted from the output while the run went "
        "(embedline gc?); nothing committed: rerun the same command to embed them again"))


def _load_into_sink(settings: RunSettings, manifest: dict[str, Any] | None,
                    summary: RunSummary, ledger: Ledger | None = None) -> RunSummary:
    """With ``--sink``, load the committed run; the run's exit code becomes the load's. Then
    only reporting is left (``shutdown.note_finishing``)."""
    if manifest is None:
        return summary
    if not settings.sink:
        shutdown.note_finishing()
        return summary
    book = ledger or Ledger(settings.ledger)
    try:
        load = load_stage(output=settings.output, manifest=manifest, sink_uri=settings.sink,
                          ledger=book, max_delete_fraction=settings.max_delete_fraction,
                          allow_failed_rows=settings.allow_failed_rows)
    finally:
        if ledger is None:
            book.close()
    changes: dict[str, Any] = {"load": load.to_dict()}
    if load.exit_code:
        done = "finished with" if load.status == "dead_letters" else "did not finish:"
        changes.update(exit_code=load.exit_code, message=f"manifest committed, but the load "
                       f"into the sink {done} {load.message}")  # fmt: skip
    loaded = RunSummary(**{**summary.to_dict(), **changes})
    if not load.exit_code:
        shutdown.note_committed(str(summary.run_key), str(summary.manifest_uri),
                                "nothing to resume", loaded.to_dict())  # fmt: skip
    shutdown.note_finishing()
    return loaded


def _reuse_planner(settings: RunSettings, plan: InputPlan, store: Any, ledger: Ledger,
                   todo: list[Any]) -> ReusePlanner:  # fmt: skip
    """Index what the store holds (when reuse is on and there is work), then plan reuse."""
    logger = get_run_logger()
    if settings.reuse and todo:
        started = time.monotonic()
        added = refresh_index(store, ledger)
        logger.info("reuse index: %d new chunk objects indexed in %.1f s", added,
                    time.monotonic() - started)  # fmt: skip
    return ReusePlanner(ledger=ledger, store=store, source=plan.source,
                        model=settings.effective_model, dimensions=settings.dimensions,
                        reuse=settings.reuse)  # fmt: skip


_SHOWN_SKIPPED_MAX = 2000  # chunks; beyond this, task runs for skipped chunks cost too much


def _show_published(runner: Any, plan: InputPlan, skipped: dict[int, ChunkOutcome],
                    store: Any) -> None:  # fmt: skip
    """One Completed("Cached") task run per chunk published before, for the UI.

    Skipped with Prefect's temporary server (no PREFECT_API_URL): nobody can look at its UI
    after the process exits, and stopping it while these runs' events are still being
    recorded printed "Error flushing events" tracebacks on successful reruns.
    """
    if not skipped or len(skipped) > _SHOWN_SKIPPED_MAX or not get_current_settings().api.url:
        return
    futures = [runner.submit(show_published_chunk, {
        "spec": plan.chunks[i], "object_uri": store.uri_for(plan.chunks[i].object_key)})
        for i in sorted(skipped)]  # fmt: skip
    for future in futures:
        future.wait()


def _summarize(
    base: RunSummary,
    plan: InputPlan,
    skipped: dict[int, ChunkOutcome],
    result: DispatchResult,
    started: float,
    *,
    cost: tuple[int, int, int] | None = None,
    on_empty_text: str = "skip",
) -> RunSummary:
    """The run's summary from its outcomes; ``cost`` (requests, tokens, inputs), when
    given, is what this process's chunk tasks sent, which the outcomes undercount after
    failures. Empty texts block the commit only with ``on_empty_text="fail"``."""
    done = {**skipped, **result.published}
    concurrent = result.published_elsewhere  # also in ``skipped``
    attempts = [*result.published.values(), *result.failed.values(), *result.released.values()]
    requests, tokens, inputs = cost or (sum(o.requests for o in attempts),
                                        sum(o.tokens for o in attempts),
                                        sum(o.inputs for o in result.published.values()))
    dead = [d for o in done.values() for d in o.dead_letters]
    rows_failed, blocking = len(dead), blocking_dead_letters(dead, on_empty_text)
    not_done = len(plan.chunks) - len(done)
    summary = _with(
        base, started,
        rows_published=sum(o.rows for o in done.values()),
        rows_skipped=sum(o.rows for i, o in skipped.items() if i not in concurrent),
        rows_concurrent=sum(o.rows for o in concurrent.values()),
        chunks_concurrent=len(concurrent),
        rows_failed=rows_failed,
        rows_empty=rows_failed - blocking,
        chunks_published=len(result.published),
        chunks_skipped=len(skipped) - len(concurrent),
        chunks_failed=len(result.failed),
        chunks_released=len(result.released),
        chunks_not_run=not_done - len(result.failed) - len(result.released),
        # every request sent and token reported, failed and released chunks included
        tokens=tokens,
        requests=requests,
        inputs=inputs,
        rows_reused=sum(o.reused for o in result.published.values()),
        rows_deduplicated=sum(o.deduplicated for o in result.published.values()),
        tokens_saved=sum(o.tokens_saved for o in result.published.values()),
    )  # fmt: skip
    signum = shutdown.stop_signal()
    if signum is not None:
        return _with(summary, started, exit_code=shutdown.exit_code_for(signum),
                     status="interrupted", message=(
                         f"{shutdown.stop_cause(signum)}: {len(done)} of "
                         f"{len(plan.chunks)} chunks published; {_resume_hint()}"))  # fmt: skip
    loss = shutdown.api_lost()
    if loss is not None and not_done:
        return _with(summary, started, exit_code=1, status="interrupted", message=(
            f"{loss.what}; {len(done)} of {len(plan.chunks)} chunks are published and kept: "
            f"{loss.todo}"))  # fmt: skip
    if result.stop is not None and result.stop.kind == "outage":
        return _with(summary, started, exit_code=1, status="incomplete", message=(
            f"stopped: {result.stop.error}; {len(done)} of {len(plan.chunks)} chunks are "
            "published and kept"))  # fmt: skip
    if result.stop is not None:
        code = 3 if result.stop.kind == "fatal" else 2
        return _with(summary, started, exit_code=code, status=result.stop.kind,
                     message=f"stopped: {result.stop.error}")  # fmt: skip
    if not_done:
        return _with(summary, started, exit_code=1, status="incomplete", message=(
            f"{not_done} of {len(plan.chunks)} chunks not published{_why(result)}; rerun the "
            "same command to retry only those chunks"))  # fmt: skip
    if blocking:
        return _with(summary, started, exit_code=1, status="dead_letters",
                     message=dead_letters_block_message(blocking, str(base.run_key)))
    return _with(summary, started, status="complete")


def _resume_hint() -> str:
    if under_prefect_runner():  # a deployment's run: the operator has no command to rerun
        return "a new run with the same parameters (or a Retry) resumes"
    return "rerun the same command to resume"


def _why(result: DispatchResult) -> str:
    """`` (N failed; chunk I: error)`` for the lowest failed chunk, or ``""``: the summary
    says what went wrong, not only the log."""
    if not result.failed:
        return ""
    first = min(result.failed)
    return f" ({len(result.failed)} failed; chunk {first}: {result.failed[first].error})"


def _commit(
    settings: RunSettings,
    plan: InputPlan,
    store: Any,
    done: dict[int, ChunkOutcome],
    summary: RunSummary,
) -> tuple[RunSummary, dict[str, Any]]:
    """Commit the run; return its summary and the manifest that stands (ours, or that of a
    concurrent run of the same key that committed first)."""
    logger = get_run_logger()
    done_ = commit_run(store, settings=settings, plan=plan, run_key=str(summary.run_key),
                       done=done, rows_failed=summary.rows_failed,
                       generation=summary.generation, supersedes=summary.supersedes)  # fmt: skip
    changes = done_.changes
    logger.info("manifest %s %s", "committed" if done_.created else "already committed",
                done_.uri)  # fmt: skip
    base = f"run {changes.base_run_key[:12]}" if changes.base_run_key else "nothing (first run)"
    logger.info("changes against %s: %s added, %s changed, %s removed, %s unchanged", base,
                *(f"{n:,}" for n in (changes.added, changes.changed, changes.removed,
                                     changes.unchanged)))  # fmt: skip
    message = committed_dead_letters_note(summary.rows_failed, summary.rows_empty)
    committed = RunSummary(**{**summary.to_dict(), **change_fields(done_.manifest), "exit_code": 0,
                              "status": "complete", "manifest_uri": done_.uri,
                              "dimensions": done_.dimensions, "message": message})  # fmt: skip
    return committed, done_.manifest


def _with(summary: RunSummary, started: float, **changes: Any) -> RunSummary:
    return RunSummary(**{**summary.to_dict(), **changes,
                         "wall_s": round(time.monotonic() - started, 3)})  # fmt: skip


def _finish(ledger: Ledger, summary: RunSummary) -> RunSummary:
    ledger.finish_run(
        str(summary.run_key),
        status=summary.status,
        rows_published=summary.rows_published,
        rows_failed=summary.rows_failed,
        manifest_uri=summary.manifest_uri,
    )
    return summary


class RunNotComplete(Exception):
    """The data of a Failed ``embed-csv`` state: carries the run summary (``.summary``).

    An exception, not a dict, because Prefect's engine re-raises a failed flow run's data;
    a dict there becomes ``TypeError: Unexpected result for failed state`` in worker logs.
    """

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(summary["message"])
        self.summary = summary


def _final(summary: RunSummary) -> State[Any]:
    if summary.exit_code == 0:
        cancellation.complete_despite_cancel()  # a cancel after the commit stopped nothing
        return Completed(message=summary.message or summary.status, data=summary.to_dict())
    failed = Failed(message=summary.message, data=RunNotComplete(summary.to_dict()))
    return cancellation.cancelled_or(failed)  # Cancelled if Prefect cancelled the run
