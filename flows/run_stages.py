"""The ``embed-csv`` flow's steps for the run driver (``flows.driver``): dispatch by chunk
tasks (``flows.embed_and_publish``), load into a sink (``flows.load``), the flow run's id, the
summary artifact; and the command's session (``flows.session``) when ``embedline run`` runs the
flow."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from adapters.embeddings import close_embedders
from embedline.models import InputPlan
from embedline.settings import RunSettings
from embedline.shutdown import STOP
from embedline.summary import RunSummary
from flows import session as sessions
from flows.artifacts import ProgressArtifact, index_phrase, load_rows_phrase, publish_summary
from flows.dispatch import Dispatched
from flows.driver import Steps, drive
from flows.embed_and_publish import embed_and_publish, new_progress_artifact
from flows.events import dead_letters_threshold
from flows.interrupt_handlers import take_over_sigterm
from flows.load import load_stage
from flows.run import Run, Work
from flows.signals import under_prefect_runner
from tasks.embed.task import store_for
from tasks.plan.task import plan_input

__all__ = ["run_settings"]


def run_settings(settings: RunSettings) -> RunSummary:
    """Run the pipeline for ``settings`` inside the current flow run; return its summary."""
    take_over_sigterm()  # run by the CLI: its SIGTERM handling, not Prefect's
    session = sessions.current()  # set by `embedline run`; checked by run key and plan
    steps = _FlowSteps(session)

    def planned(settings: RunSettings) -> InputPlan:
        handed = session.take_plan(settings) if session is not None else None
        # quote: Prefect passes the plan through unwalked (it is no task input to track)
        plan: InputPlan = plan_input(settings, handed=quote(handed))  # type: ignore[call-overload]
        return plan

    try:
        return drive(
            lambda **again: Run.open(
                settings,
                store=store_for(settings.output),
                plan_input=planned,
                log=get_run_logger(),
                **again,
            ),
            steps,
        )
    finally:
        close_embedders()  # a latched (fatal) client must not outlive its run


class _FlowSteps(Steps):
    """The flow's steps: chunk tasks, the sink's load stage, the summary artifact; the
    progress artifacts from the dispatch to the summary, the load and its index build as
    their own lines."""

    def __init__(self, session: sessions.Session | None) -> None:
        self.session = session
        self.flow_run_id = flow_run.get_id()
        self.progress: ProgressArtifact | None = None

    def before_record(self, run: Run) -> None:
        # read now, while the API is known to answer: after the commit a lost API would make
        # Prefect's client retry this call for a minute
        self.dead_letters_threshold = dead_letters_threshold()

    def dispatch(self, run: Run, work: Work) -> Dispatched:
        self.progress = new_progress_artifact(run)
        try:
            return embed_and_publish(run, work, self.session, self.progress)
        except BaseException:
            self.progress.close()
            raise

    def resume_hint(self) -> str:
        left = STOP.report.left_running()  # Batch API batches: how to collect or cancel them
        if left is not None:
            return left
        if under_prefect_runner():  # a deployment's run: the operator has no command to rerun
            return "a new run with the same parameters (or a Retry) resumes"
        return "rerun the same command to resume"

    def load(self, run: Run, manifest: dict[str, Any], summary: RunSummary) -> RunSummary:
        """The load stage into ``--sink``; the run's exit code becomes the load's."""
        settings = run.settings
        assert settings.sink is not None
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
                on_stage=self.progress.stage if self.progress is not None else None,
                index=settings.index,
            )
        finally:
            if opened_here:
                run.close()
                run.ledger = None
        if self.progress is not None:
            done = f"{load.status}: {load_rows_phrase(load)}, {load.wall_s:.1f} s"
            self.progress.stage("load", done)
            self.progress.stage("index", index_phrase(load))
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
        return loaded

    def report(self, run: Run, summary: RunSummary) -> None:
        if self.progress is not None:
            self.progress.close()  # its last value first: the summary follows it
        if STOP.report.api_lost() is None:  # else no artifact: each call would retry a minute
            publish_summary(summary, **run.report_facts())
