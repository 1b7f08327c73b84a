"""The embed + publish stage of the ``embed-csv`` flow: chunk tasks on a task runner.

Each chunk task embeds its rows (reusing vectors the output already holds) and publishes one
chunk object; chunks with little to send share a task run, one after another
(``tasks.embed.groups``). The ``Dispatcher`` keeps a window of task runs in flight and records
each chunk's outcome in the ledger as it arrives (docs/reference/output-layout.md,
docs/reference/failure-classes.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from prefect import get_run_logger
from prefect.settings import get_current_settings

from embedline.errors import EmbedlineError
from embedline.models import ChunkBatches, ChunkOutcome, ChunkSpec, InputPlan
from embedline.progress import Usage, cost_in_process, reset_cost
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from embedline.shutdown import STOP
from flows.artifacts import ProgressArtifact
from flows.batch_stage import BatchStage, Staged
from flows.chunk_futures import chunks_of
from flows.copied_run import prepare_stage, publish_copied_chunk, take_stage
from flows.dispatch import Dispatched, Dispatcher, DispatchResult
from flows.lengths import redo_other_lengths
from flows.local_chunks import LocalChunks
from flows.lost_chunks import SettlingDispatch, settle_lost_chunks
from flows.progress_report import ProgressReport, progress_reporter
from flows.run import Run, Work
from flows.session import Session
from flows.signals import dispatch_with_graceful_stop
from flows.task_runner import has_workers, in_flight, task_runner, warm_up, worker_wait_s
from flows.worker_watch import WorkerWatch
from tasks.embed.failures import ChunkFailure, status_for
from tasks.embed.groups import CLUSTER_CHUNKS_PER_RUN, ChunkGroup, chunk_groups
from tasks.embed.spent import drain_spent
from tasks.embed.task import embed_chunk, embed_chunks, show_published_chunk
from tasks.lease.run_stop import mark_run_stopped, new_stop_key
from tasks.reuse.stage import ReuseStage

__all__ = ["embed_and_publish", "new_progress_artifact"]


def embed_and_publish(
    run: Run,
    work: Work,
    session: Session | None = None,
    artifact: ProgressArtifact | None = None,
) -> Dispatched:
    """Plan and copy what the run reuses (``ReuseStage``: the one the command's ``session``
    prepared, if any), then embed and publish ``work.todo`` (then the chunks of another
    vector length again), with progress artifacts (``artifact``, which the caller closes,
    or ones of its own), honouring signals (``dispatch_with_graceful_stop``)."""
    assert run.ledger is not None, "embed_and_publish() of a run not recorded"
    STOP.report.note_left_running(None)  # an earlier run's batches, in a long-lived process
    logger = get_run_logger()
    stage = take_stage(run, work, logger, session) or prepare_stage(run, work, logger)
    own = artifact is None
    try:
        if artifact is None:
            artifact = new_progress_artifact(run)
        return _embed_and_publish(run, work, stage, artifact)
    finally:
        stage.close()
        if own and artifact is not None:
            artifact.close()


def new_progress_artifact(run: Run) -> ProgressArtifact:
    """The run's progress artifacts (``ProgressArtifact``), posting from now on."""
    return ProgressArtifact(description=f"{run.plan.source.name}: rows embedded and published")


def _embed_and_publish(
    run: Run, work: Work, stage: ReuseStage, artifact: ProgressArtifact
) -> Dispatched:
    logger = get_run_logger()
    settings, plan, store, ledger = run.settings, run.plan, run.store, run.ledger
    assert ledger is not None
    report = progress_reporter(plan, work.skipped, artifact)
    report(DispatchResult())
    try:
        staged = _batches(run, work, stage, report) if settings.batch_api else None
    except EmbedlineError as exc:  # the Batch API refused or could not be reached
        failure = status_for(exc)
        stop = (
            failure
            if failure.kind != "failed"
            else ChunkFailure("outage", failure.error, expected=True)
        )  # a rerun resumes: nothing was lost
        return Dispatched(DispatchResult(stop=stop, not_run=[s.index for s in work.todo]), None, 0)
    if staged is not None and staged.fatal:  # a batch failed validation: exit 3
        failure = ChunkFailure("fatal", staged.fatal, expected=True)
        return Dispatched(
            DispatchResult(stop=failure, not_run=[s.index for s in work.todo]), None, staged.batches
        )
    if staged is not None and staged.interrupted:  # a signal while waiting: the summary
        # says it, and that the batches keep running (STOP.report.left_running)
        return Dispatched(
            DispatchResult(not_run=[s.index for s in work.todo]), None, staged.batches
        )
    window = 2 if settings.embedder == "local" else settings.concurrency + 1
    retries = dict(
        retries=settings.chunk_retries,
        retry_delay_seconds=settings.chunk_retry_delay_s,
        # None: no jitter (Task's own type); with_options's annotation leaves None out
        retry_jitter_factor=0.5 if settings.chunk_retry_delay_s else None,
    )
    chunk_task = embed_chunk.with_options(**retries)  # type: ignore[arg-type]
    group_task = embed_chunks.with_options(**retries)  # type: ignore[arg-type]
    reset_cost()
    runner_started = time.monotonic()
    copied = LocalChunks(lambda spec: publish_copied_chunk(run, work, stage, spec, logger))
    with task_runner(settings, window) as runner, contextlib.closing(copied):
        unfit = warm_up(runner, settings, logger, since=runner_started, work_left=bool(work.todo))
        if unfit is not None:  # a worker lacks a setting: stop before any chunk, exit 3
            failure = ChunkFailure("fatal", unfit, expected=True)
            return Dispatched(
                DispatchResult(stop=failure, not_run=[s.index for s in work.todo]), None, 0
            )
        window = in_flight(runner, settings, window)
        if settings.task_runner == "dask":
            logger.info("chunk task runs in flight: at most %d (the cluster's threads)", window)
        else:  # said too: a deployment run whose parameters left the cluster out shows it
            logger.info("task runner: threads of this process, at most %d chunks in flight", window)

        # a run on Dask: its stop reaches the workers through the store (run_stop)
        stop_key = new_stop_key(run.run_key) if settings.task_runner == "dask" else None

        def submit(group: tuple[ChunkSpec, ...]) -> list[Any]:
            common = {
                "source": plan.source,
                "settings": settings,
                "dimensions": work.length.current(),
                "run_key": run.run_key,
                **({"stop_key": stop_key} if stop_key else {}),
            }
            if len(group) == 1 and stage.fully_copied(group[0]):  # no task run (local_chunks)
                return [copied.submit(group[0])]
            if len(group) == 1:  # a task run of its own: embed-chunk-NNNN
                single = _chunk_inputs(group[0], stage, staged)
                return [runner.submit(chunk_task, {"spec": group[0], **common, **single})]
            inputs = [_chunk_inputs(spec, stage, staged) for spec in group]
            parameters = {
                "group": ChunkGroup(group),
                **common,
                "reuse": tuple(i["reuse"] for i in inputs),
                "batches": tuple(i["batches"] for i in inputs) if staged is not None else None,
            }
            return chunks_of(runner.submit(group_task, parameters), len(group))

        def on_outcome(result: DispatchResult) -> None:
            work.length.answered(result.published.values())
            report(result)

        watch = (  # a cluster by address that lost its last worker mid-run (worker_watch)
            WorkerWatch(runner.client, settings.dask_address, worker_wait_s(), logger)
            if settings.task_runner == "dask" and settings.dask_address
            else None
        )

        def on_tick(result: DispatchResult) -> None:
            report(result)
            gone = watch.gone_for_good() if watch is not None else None
            if gone is not None:
                result.workers_lost = True  # their chunks may be published: lost_chunks
                dispatcher.stop(ChunkFailure("outage", gone, expected=True), grace_s=0.0)

        dispatcher = Dispatcher(
            ledger=ledger,
            run_key=run.run_key,
            object_uri=lambda spec: store.uri_for(spec.object_key),
            submit=submit,
            window=window,
            logger=logger,
            on_outcome=on_outcome,
            on_tick=on_tick,
            on_gave_up=stage.note_failed,
            grace_s=settings.grace_s,
            group=lambda specs: _groups(specs, stage, settings, window),
            on_stop=(lambda: mark_run_stopped(store, stop_key)) if stop_key else None,
        )
        if has_workers(runner):  # a cluster with none has nothing to embed (warm_up)
            _show_published(runner, plan, work.skipped, store)
        STOP.start_dispatching()  # an API loss from now on: the summary is handed over
        result = dispatch_with_graceful_stop(
            _settling(dispatcher, run) if settings.task_runner == "dask" else dispatcher,
            work.todo,
            grace_s=settings.grace_s,
            logger=logger,
        )
        redo_other_lengths(
            dispatcher,
            store=store,
            plan=plan,
            skipped=work.skipped,
            length=work.length,
            grace_s=settings.grace_s,
            logger=logger,
        )
    if copied.submitted:
        logger.info(
            "%d chunks had every row copied: published by the flow itself, no "
            "request and no task run",
            copied.submitted,
        )
    stage.index_published(result.published.values())  # the next run reads none of them
    cost = _cost(run)
    return Dispatched(result, cost, staged.batches if staged is not None else 0)


def _settling(dispatcher: Dispatcher, run: Run) -> SettlingDispatch:
    """The dispatch of a run on Dask: a lost cluster's workers may still publish the chunks
    they ran (``flows.lost_chunks``), waited for under the run's signal handling."""
    assert run.ledger is not None
    ledger, logger = run.ledger, get_run_logger()

    def settle(result: DispatchResult) -> int:
        return settle_lost_chunks(
            result,
            run.plan.chunks,
            store=run.store,
            ledger=ledger,
            run_key=run.run_key,
            model=run.settings.effective_model,
            wait_s=run.settings.grace_s,
            logger=logger,
        )

    return SettlingDispatch(dispatcher, settle)


def _cost(run: Run) -> Usage | None:
    """What the run's chunks sent: this process's tally with threads; on Dask, the spend
    records its chunk tasks left in the store (``tasks/embed/spent.py``), which count a
    killed worker's and a dropped copy's requests too; None (the outcomes' counts) in Batch
    API mode or when the store cannot be listed."""
    settings = run.settings
    if settings.task_runner == "threads":
        return cost_in_process()
    if settings.batch_api:
        return None
    try:
        return drain_spent(run.store, run.run_key)
    except (EmbedlineError, OSError) as exc:
        get_run_logger().warning("could not read the run's spend records: %s", exc)
        return None


def _groups(
    specs: Sequence[ChunkSpec], stage: ReuseStage, settings: RunSettings, window: int
) -> list[tuple[ChunkSpec, ...]]:
    """The chunk task runs of ``specs`` (docs/reference/prefect.md, "Chunk groups"): a chunk
    with every row copied alone (published by the flow, no task run); the others in groups
    (``tasks.embed.groups``), at least ``window`` (the groups run at once) when there are
    that many. Chunk tasks on a Dask cluster that shares no disk with the flow get their
    copied vectors in their parameters: their groups are sized by all their rows, not only
    the rows they send, so a group's parameters stay near a chunk's."""
    copied = [(spec,) for spec in specs if stage.fully_copied(spec)]
    to_send = [spec for spec in specs if not stage.fully_copied(spec)]
    grouped = chunk_groups(
        to_send,
        to_send=stage.rows_to_send if stage.shared_disk else (lambda spec: spec.rows),
        chunk_size=settings.chunk_size,
        parallel=window,
        per_run=CLUSTER_CHUNKS_PER_RUN if settings.task_runner == "dask" else 1,
    )
    return sorted([*copied, *grouped], key=lambda group: group[0].index)


def _batches(run: Run, work: Work, stage: ReuseStage, report: ProgressReport) -> Staged:
    """Batch API mode: submit the work's requests as batches, wait, collect
    (``flows.batch_stage``), the batches by status in the progress ``report``; a first signal
    stops it as it stops the dispatcher (``dispatch_with_graceful_stop``):
    ``Staged.interrupted``, the batches left running."""
    assert run.ledger is not None
    logger = get_run_logger()
    batches = BatchStage(
        settings=run.settings,
        ledger=run.ledger,
        run_key=run.run_key,
        planner=stage,
        source=run.plan.source,
        log=logger,
        on_progress=report.batches,
    )
    return dispatch_with_graceful_stop(
        batches,
        work.todo,
        grace_s=run.settings.grace_s,
        logger=logger,
        stopping="nothing more is submitted; the run's batches keep running at the provider",
    )


def _chunk_inputs(spec: ChunkSpec, stage: ReuseStage, staged: Staged | None) -> dict[str, Any]:
    """The reuse plan of a chunk task (the batch stage's, which its batches were built
    from) and, in Batch API mode, its batches' result files and recorded layouts."""
    if staged is None:
        return {"reuse": stage.plan_for(spec)}
    plan = staged.plans.get(spec.index)
    return {
        "reuse": stage.plan_for(spec) if plan is None else plan,
        "batches": staged.answers.get(spec.index, ChunkBatches()),
    }


_SHOWN_SKIPPED_MAX = 2000  # chunks; beyond this, task runs for skipped chunks cost too much


def _show_published(
    runner: Any, plan: InputPlan, skipped: dict[int, ChunkOutcome], store: ObjectStore
) -> None:
    """One Completed("Cached") task run per chunk published before, for the UI.

    Skipped with Prefect's temporary server (no PREFECT_API_URL): nobody can look at its UI
    after the process exits, and stopping it while these runs' events are still being
    recorded prints "Error flushing events" tracebacks on successful reruns.
    """
    if not skipped or len(skipped) > _SHOWN_SKIPPED_MAX or not get_current_settings().api.url:
        return
    futures = [
        runner.submit(
            show_published_chunk,
            {"spec": plan.chunks[i], "object_uri": store.uri_for(plan.chunks[i].object_key)},
        )
        for i in sorted(skipped)
    ]
    for future in futures:
        future.wait()
