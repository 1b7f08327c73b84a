"""The run driver: one sequence of ``flows.run.Run`` steps for every run, whoever drives it.

The ``embed-csv`` flow (``flows.run_stages``) and ``embedline run`` before Prefect starts
(``cli.run_without_prefect``) both call ``drive``:

    open → committed already? load : record → check the store → lease → work left →
    [wait for an earlier live run] → dispatch → conclude (the commit) → load

What differs between them is passed in as ``Steps``: how chunks are dispatched (the flow's
``embed_and_publish``; the CLI's "publish if every row is copied, else hand the run to the
flow"), how a committed run is loaded into a sink, the flow run's id, whether the commit
event goes out. The lease policy, the commit hook and the handling of a stopped run are
here, once:

- the lease: taken before the published chunks are looked for and held until the run ends
  (its load included), unless the command's session already holds it (``flows.session``);
- overlapping runs: a run with something to send that finds an earlier live run's lease on
  its output waits for it, bounded, then looks for its work again, or steps aside
  (``waited_for_earlier_runs``, ``tasks.lease.overlap``); a run with nothing to send
  never waits (it cannot pay for anything); a session's lease was taken, and waited with,
  by the command;
- at the commit (``_note_committed``): ``STOP.report`` notes it, so an interrupt from then on
  is not reported as work to redo, and ``embedline.run.committed`` is emitted when events
  should go out;
- a step that ends the run short of its commit raises ``RunStopped``; ``drive`` returns its
  summary (the one handler). ``HandedToFlow`` (the CLI's steps only) passes through, carrying
  what the flow takes over.

Prefect-free: the CLI drives runs here before Prefect starts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from embedline.errors import DiskFullError
from embedline.shutdown import STOP
from embedline.summary import RunSummary
from flows.disk_full_summary import disk_full_fields
from flows.dispatch import Dispatched
from flows.interrupt_handlers import only_reporting_left
from flows.run import NightOfAnotherLength, Run, RunStopped, Work
from flows.session import Session
from tasks.lease.overlap import span_text, wait_for_earlier_runs

if TYPE_CHECKING:
    from tasks.reuse.stage import ReuseStage

__all__ = ["STEPPED_ASIDE_EXIT", "HandedToFlow", "Steps", "drive", "waited_for_earlier_runs"]

#: The exit code of a run that stepped aside for an earlier live run on its output:
#: ``EX_TEMPFAIL`` of sysexits.h ("try again later"), which schedulers and systemd know.
STEPPED_ASIDE_EXIT = 75


class HandedToFlow(Exception):
    """Raised by the CLI's ``Steps`` when the run needs the flow: ``stage``, the reuse stage
    prepared for chunks ``stage_chunks`` (indexes), if any. When the run was recorded,
    ``drive`` adds its ``lease`` (held) and ``hard_exit_hook`` (registered), for the flow."""

    def __init__(self, stage: ReuseStage | None = None, stage_chunks: tuple[int, ...] = ()) -> None:
        super().__init__("the run needs the flow")
        self.stage, self.stage_chunks = stage, stage_chunks
        self.lease: contextlib.ExitStack | None = None
        self.hard_exit_hook: Callable[[], None] | None = None


class Steps:
    """What ``drive``'s caller supplies. ``flow_run_id``: recorded with the run (None outside
    a flow run); ``emit_events``: whether ``embedline.run.committed`` goes out at the commit,
    with ``embedline.run.dead-letters-exceeded`` above ``dead_letters_threshold`` rows;
    ``session``: what the command prepared for the run (``flows.session``)."""

    flow_run_id: str | None = None
    emit_events: bool = True
    dead_letters_threshold: int | None = None
    session: Session | None = None

    def before_record(self, run: Run) -> None:
        """Called once the run is open and not committed, before anything is recorded."""

    def before_lease(self, run: Run) -> None:
        """Called once the run is recorded and the store checked, before it is leased: may
        raise ``HandedToFlow`` for a run that only the flow can do (the flow leases it)."""

    def dispatch(self, run: Run, work: Work) -> Dispatched:
        """Embed and publish ``work.todo`` (and any chunks of another vector length)."""
        raise NotImplementedError

    def resume_hint(self) -> str:
        """What the summary of a run stopped after its dispatch tells the user to do."""
        return "rerun the same command to resume"

    def load(self, run: Run, manifest: dict[str, Any], summary: RunSummary) -> RunSummary:
        """Load committed ``run`` (``manifest``) into ``run.settings.sink``: ``summary`` with
        the load's."""
        raise NotImplementedError

    def report(self, run: Run, summary: RunSummary) -> None:
        """Called with a recorded run's summary while its ledger is open."""


def drive(open_run: Callable[..., Run], steps: Steps) -> RunSummary:
    """Open a run (``open_run``, e.g. ``Run.open`` with its arguments; called again with
    ``full_night=True`` when a delta night's vectors come back of another length,
    ``NightOfAnotherLength``) and take it through the steps (module docstring); its
    summary. The planning pass's scratch files are
    released when the run ends here, not when the flow takes it over.

    :raises HandedToFlow: (the CLI's steps) the flow takes the run over.
    """
    try:
        try:
            return _driven(open_run(), steps)
        except NightOfAnotherLength as exc:
            logging.getLogger("embedline.run").warning(
                "the server's vectors are now %d long, those of the run this night builds on "
                "%d: embedding every row again as a full night",
                exc.length,
                exc.inherited,
            )
            return _driven(open_run(full_night=True, learned_length=exc.length), steps)
    except RunStopped as stopped:  # the one handler: the step's summary is the run's
        return stopped.summary


def _driven(run: Run, steps: Steps) -> RunSummary:
    """``drive``'s steps for an open run (the planning scratch released at its end here)."""
    handed = False
    try:
        if run.committed is not None:  # nothing to embed; perhaps a load left to do
            return _load(run, run.committed, run.already_committed(), steps)
        steps.before_record(run)
        return _recorded(run, steps)
    except HandedToFlow:
        handed = True
        raise
    finally:
        if not handed:
            run.discard_scratch()


def _recorded(run: Run, steps: Steps) -> RunSummary:
    """Record the run and take it through to its load, reported (``Steps.report``) while the
    ledger is open; a full ledger's filesystem is one ``disk_full`` summary."""
    if run.ledger is None:
        try:
            run.open_ledger()
        except DiskFullError as exc:  # exit 1, one line; nothing started
            raise RunStopped(
                run.summary(exit_code=exc.exit_code, status="disk_full", message=str(exc))
            ) from None
    try:
        try:
            summary = _record_to_load(run, steps)
        except RunStopped as stopped:
            steps.report(run, stopped.summary)
            raise
        except DiskFullError as exc:  # the ledger mid-run: what is published stays published
            raise RunStopped(
                run.summary(**disk_full_fields(exc, run.plan, run.store, run.settings))
            ) from None
        steps.report(run, summary)
        return summary
    finally:
        run.close()


def _record_to_load(run: Run, steps: Steps) -> RunSummary:
    """Record the run, lease what it needs, find its work, dispatch it, commit, load: its
    summary. The lease covers the load too: the load reads the chunk objects.

    :raises HandedToFlow: (the CLI's steps) the run stays ``running``, its lease held by
        the exception (``lease``), and a hard exit before the flow has run marks it
        ``interrupted`` (``hard_exit_hook``).
    """
    handed: HandedToFlow | None = None
    with run.recorded(flow_run_id=steps.flow_run_id), contextlib.ExitStack() as leased:
        run.check_store()
        # gc keeps what the lease lists from before the published chunks are looked for
        # until the end (the load reads them too), whatever its grace period
        session, holding = steps.session, False
        try:
            steps.before_lease(run)
            lease_key: str | None = None  # a session's lease: the command waited with it
            if session is not None and session.holds_lease(run.run_key):
                leased.enter_context(session.take_lease())  # released when this run ends
            else:
                lease_key = leased.enter_context(run.leased())
            holding = True
            work = run.work_left()
            if (
                lease_key is not None
                and run.needs_dispatch(work)
                and waited_for_earlier_runs(run, lease_key)
            ):
                work = run.work_left()  # what the earlier run published meanwhile
            dispatched = steps.dispatch(run, work)
        except HandedToFlow as exc:  # the flow records the run's end: leave the block as is
            exc.lease, handed = (leased.pop_all() if holding else None), exc
        else:
            committed = run.conclude(
                work,
                dispatched.result,
                cost=dispatched.cost,
                batches=dispatched.batches,
                resume_hint=steps.resume_hint(),
                on_committed=lambda summary: _note_committed(run, summary, steps),
            )
            return _load(run, committed.manifest, committed.summary, steps)
    assert handed is not None
    handed.hard_exit_hook = run.hard_stop_hook()
    STOP.exit.on_hard_exit(handed.hard_exit_hook)
    raise handed


def waited_for_earlier_runs(run: Run, lease_key: str) -> bool:
    """Wait, at most ``run.settings.wait_for_live_run_s`` seconds, for the earlier live runs
    on ``run``'s output that may send texts it would copy (``tasks.lease.overlap``; ``run``
    holds lease ``lease_key``); whether it waited (its work left is then looked for again:
    the earlier run published meanwhile).

    :raises RunStopped: the bound passed with an earlier run still live: the run steps
        aside, nothing published (status ``stepped_aside``, ``STEPPED_ASIDE_EXIT``).
    :raises EmbedlineError: the store cannot be listed or read.
    """
    bound = run.settings.wait_for_live_run_s
    waited = wait_for_earlier_runs(
        run.store,
        lease_key,
        run_key=run.run_key,
        model=run.settings.effective_model,
        dimensions=run.settings.dimensions,
        bound_s=bound,
        log=run.log,
    )
    if waited.left:
        first = waited.left[0]
        run.stop(
            run.summary(
                exit_code=STEPPED_ASIDE_EXIT,
                status="stepped_aside",
                message=(
                    f"run {first.run_key[:12]} on this output, which may be embedding "
                    "texts this run would copy, was still running after "
                    f"{span_text(bound)} (--wait-for-live-run {bound:g}): stepped aside, "
                    "nothing published; run the same command again once it has ended"
                ),
            )
        )
    return waited.waited


def _note_committed(run: Run, summary: RunSummary, steps: Steps) -> None:
    """The commit hook: tell the signal handlers the run is committed (an interrupt now
    stops nothing) and emit ``embedline.run.committed`` when events go out."""
    if steps.emit_events:
        from flows.events import emit_run_committed

        emit_run_committed(summary, dead_letters_threshold=steps.dead_letters_threshold)
    sink = run.settings.sink
    STOP.report.note_committed(
        run.run_key,
        str(summary.manifest_uri),
        ("rerun the same command to load it into the sink" if sink else "nothing to resume"),
        None if sink else summary.to_dict(),
    )
    if not sink:
        only_reporting_left()


def _load(run: Run, manifest: dict[str, Any], summary: RunSummary, steps: Steps) -> RunSummary:
    """With a sink, load the committed run (``Steps.load``); then only reporting is left
    (``only_reporting_left``)."""
    if run.settings.sink:
        summary = steps.load(run, manifest, summary)
    only_reporting_left()
    return summary
