"""The stages of one run inside a flow run, in order: open (plan, or find it committed) →
record → lease → find the work left → embed and publish → commit → load into a sink. Each
stage is a method of ``flows.run.Run`` or a stage module (``flows.embed``, ``flows.load``);
this module says their order and what the signal handlers and the CLI learn at the commit."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.runtime import flow_run

from adapters.embeddings import close_embedders
from embedline.errors import DiskFullError
from embedline.models import RunSummary
from embedline.settings import RunSettings
from embedline.shutdown import STOP
from flows.disk_full import disk_full_fields
from flows.embed import embed_and_publish
from flows.interrupt_handlers import only_reporting_left, take_over_sigterm
from flows.load import load_stage
from flows.run import CommittedRun, Run
from flows.signals import under_prefect_runner
from tasks.chunk import store_for
from tasks.events import dead_letters_threshold, emit_run_committed
from tasks.plan import plan_input
from tasks.report import publish_summary

__all__ = ["run_settings"]


def run_settings(settings: RunSettings) -> RunSummary:
    """Run the pipeline for ``settings`` inside the current flow run; return its summary."""
    take_over_sigterm()  # run by the CLI: its SIGTERM handling, not Prefect's
    opened = Run.open(
        settings, store=store_for(settings.output), plan_input=plan_input, log=get_run_logger()
    )
    if isinstance(opened, RunSummary):  # an input error, or a store that cannot be read
        return opened
    try:
        return _run_opened(opened)
    finally:
        opened.discard_scratch()


def _run_opened(run: Run) -> RunSummary:
    """``run_settings`` once the run is open: commit, load, or record, embed, commit, load."""
    settings = run.settings
    if run.committed is not None:  # nothing to embed; perhaps a load left to do
        return _load_into_sink(run, run.committed, run.already_committed())
    try:
        run.open_ledger()
    except DiskFullError as exc:  # exit 1, one line; nothing started
        return run.summary(exit_code=exc.exit_code, status="disk_full", message=str(exc))
    # read now, while the API is known to answer: after the commit a lost API would make
    # Prefect's client retry this call for a minute
    threshold = dead_letters_threshold()
    try:
        try:
            summary = _record_embed_commit_load(run, threshold)
        except DiskFullError as exc:  # the ledger mid-run: what is published stays published
            return run.summary(**disk_full_fields(exc, run.plan, run.store, settings))
        if STOP.report.api_lost() is None:  # else no artifact: each call would retry a minute
            publish_summary(summary, **run.report_facts())
        return summary
    finally:
        run.close()
        close_embedders()  # a latched (fatal) client must not outlive its run


def _record_embed_commit_load(run: Run, threshold: int | None) -> RunSummary:
    """Record the run, lease what it needs, find its work, embed and publish it, commit,
    load: its summary. The lease covers the load too: the load reads the chunk objects."""
    with run.recorded(flow_run_id=flow_run.get_id()):
        refused = run.check_store()
        if refused is not None:
            return refused
        # gc keeps what the lease lists from before the published chunks are looked for
        # until the end (the load reads them too), whatever its grace period
        with run.leased():
            work = run.work_left()
            if isinstance(work, RunSummary):
                return work
            dispatched = embed_and_publish(run, work)
            ended = run.conclude(
                work,
                dispatched.result,
                cost=dispatched.cost,
                resume_hint=_resume_hint(),
                on_committed=lambda summary: _note_committed(run, summary, threshold),
            )
            (
                ended.summary if isinstance(ended, CommittedRun) else ended
            ).batches = dispatched.batches
            if isinstance(ended, CommittedRun):
                return _load_into_sink(run, ended.manifest, ended.summary)
            return ended


def _note_committed(run: Run, summary: RunSummary, threshold: int | None) -> None:
    """Tell the signal handlers the run is committed (an interrupt now stops nothing), and
    emit ``embedline.run.committed``."""
    emit_run_committed(summary, dead_letters_threshold=threshold)
    sink = run.settings.sink
    STOP.report.note_committed(
        run.run_key,
        str(summary.manifest_uri),
        ("rerun the same command to load it into the sink" if sink else "nothing to resume"),
        None if sink else summary.to_dict(),
    )
    if not sink:
        only_reporting_left()


def _resume_hint() -> str:
    left = STOP.report.left_running()  # Batch API batches: how to collect or cancel them
    if left is not None:
        return left
    if under_prefect_runner():  # a deployment's run: the operator has no command to rerun
        return "a new run with the same parameters (or a Retry) resumes"
    return "rerun the same command to resume"


def _load_into_sink(run: Run, manifest: dict[str, Any], summary: RunSummary) -> RunSummary:
    """With ``--sink``, load the committed run; the run's exit code becomes the load's. Then
    only reporting is left (``only_reporting_left``)."""
    settings = run.settings
    if not settings.sink:
        only_reporting_left()
        return summary
    opened_here = run.ledger is None
    ledger = run.open_ledger() if run.ledger is None else run.ledger
    try:
        load = load_stage(
            output=settings.output,
            manifest=manifest,
            sink_uri=settings.sink,
            ledger=ledger,
            max_delete_fraction=settings.max_delete_fraction,
            allow_failed_rows=settings.allow_failed_rows,
        )
    finally:
        if opened_here:
            run.close()
            run.ledger = None
    changes: dict[str, Any] = {"load": load.to_dict()}
    if load.exit_code:
        done = "finished with" if load.status == "dead_letters" else "did not finish:"
        changes.update(
            exit_code=load.exit_code,
            message=f"manifest committed, but the load into the sink {done} {load.message}",
        )
    loaded = run.summary(summary, wall_s=summary.wall_s, **changes)
    if not load.exit_code:
        STOP.report.note_committed(
            run.run_key, str(summary.manifest_uri), "nothing to resume", loaded.to_dict()
        )
    only_reporting_left()
    return loaded
