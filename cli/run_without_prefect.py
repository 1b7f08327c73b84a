"""What ``embedline run`` finishes before Prefect starts, on ``flows.run.Run`` as the flow
would: a run already committed, or a run with nothing to send and no sink. Otherwise it hands
the flow its plan, and holds the run's lease and hard-exit hook until the flow has run."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from typing import TYPE_CHECKING, Any

from embedline.shutdown import STOP

if TYPE_CHECKING:
    from cli.plan_ahead import PlanAhead
    from embedline.models import RunSummary
    from embedline.settings import RunSettings
    from flows.run import Run

__all__ = ["drop_recorded_run_hook", "release_handed_leases", "run_without_prefect"]


#: The hard-exit hook of a run ``run_without_prefect`` recorded (``running``) and left to the
#: flow; dropped once the flow ran, which records the run's end itself.
_recorded_run_hook: Any = None
_handed_leases: list[contextlib.ExitStack] = []  # held to the end: no gap before the flow's


def run_without_prefect(
    settings: RunSettings,
    *,
    emit_events: bool,
    ahead: PlanAhead | None = None,
) -> dict[str, Any] | tuple[str, int] | None:
    """What ``run`` finishes before Prefect starts, on ``flows.run.Run`` as the flow would:
    a run already committed (its summary; the ledger catches up if it lags the store), or a
    run with nothing to send and no sink (a re-export with new bytes, same rows: commit it,
    about a second; every row copied from earlier objects: publish and commit). Else None:
    the flow runs next, in this process, with the plan (and reuse stage) handed over.
    (message, exit code) for an input or store error. A committed run writes nothing to
    the store, as docs/reference/output-layout.md asks. ``emit_events``: send
    ``embedline.run.committed`` for a commit (False with the CLI's temporary server, which
    runs no automations and is stopped when the command ends). ``ahead``: the plan comes
    from that child process instead (``cli/plan_ahead.py``).
    """
    import logging
    import time

    from adapters.csv_source import plan_csv
    from adapters.object_store import open_store
    from adapters.plan_hand_over import hand_over_plan
    from embedline.errors import EmbedlineError
    from embedline.models import RunSummary
    from flows.run import Run

    started = time.monotonic()
    try:
        opened = Run.open(
            settings,
            store=open_store(settings.output),
            plan_input=ahead.plan
            if ahead is not None
            else lambda s: plan_csv(s.input, **s.plan_arguments),
            log=logging.getLogger("embedline.run"),
            started=started,
        )
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    except OSError:
        return None  # let the flow report it with its full context
    if isinstance(opened, RunSummary):
        return opened.message, opened.exit_code
    if opened.committed is not None:
        opened.discard_scratch()
        return opened.already_committed().to_dict()
    summary = None if settings.sink else _commit_without_dispatch(opened, emit_events)
    if summary is None:  # the flow takes the plan over, with its scratch files
        hand_over_plan(opened.plan, settings.input, **settings.plan_arguments)
    else:
        opened.discard_scratch()
    return summary


def _commit_without_dispatch(
    run: Run,
    emit_events: bool,
) -> dict[str, Any] | tuple[str, int] | None:
    """Record ``run``, find its work and, if no chunk task is needed (all published, or all
    left copied: ``flows.copied_run``), conclude it (``embedline.run.committed`` emitted if
    ``emit_events``); None if the flow has work to do."""
    from embedline.errors import EmbedlineError
    from embedline.models import RunSummary
    from flows.copied_run import may_publish_here, publish_if_all_copied
    from flows.dispatch import Dispatched, DispatchResult
    from flows.run import CommittedRun

    global _recorded_run_hook
    try:
        run.open_ledger()
    except (OSError, sqlite3.Error):
        return None  # the flow reports it with its full context
    try:
        with run.recorded(flow_run_id=None):
            refused = run.check_store()
            if refused is not None:
                return refused.to_dict()
            work = run.work_left()
            if isinstance(work, RunSummary):
                return work.to_dict()
            needed = run.needs_dispatch(work)
            dispatched = (
                None
                if needed and not may_publish_here(run, work)
                else Dispatched(DispatchResult(), None)
            )
            with contextlib.ExitStack() as lease:
                if dispatched:  # gc keeps what the lease lists, until the flow ends if handed
                    lease.enter_context(run.leased())
                if needed and dispatched:
                    dispatched = publish_if_all_copied(run, work)
                    if dispatched is None:
                        _handed_leases.append(lease.pop_all())
                if dispatched is not None:
                    ended = run.conclude(
                        work,
                        dispatched.result,
                        cost=dispatched.cost,
                        on_committed=functools.partial(_note_committed, run, emit_events),
                    )
            if dispatched is None:  # `running`: an interrupt or hard exit marks it `interrupted`
                _recorded_run_hook = run.hard_stop_hook()
                STOP.exit.on_hard_exit(_recorded_run_hook)
                return None
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    finally:
        run.close()
    return (ended.summary if isinstance(ended, CommittedRun) else ended).to_dict()


def _note_committed(run: Run, emit_events: bool, summary: RunSummary) -> None:
    """The commit hook: nothing is left to resume, and ``embedline.run.committed`` is emitted
    if ``emit_events``."""
    from tasks.events import emit_run_committed

    STOP.report.note_committed(run.run_key, str(summary.manifest_uri), "nothing to resume")
    if emit_events:
        emit_run_committed(summary)


def drop_recorded_run_hook() -> None:
    """The flow has run and recorded the run's end itself: the hard-exit hook of the run
    recorded here is no longer needed."""
    if _recorded_run_hook is not None:
        STOP.exit.remove_hard_exit_hook(_recorded_run_hook)


def release_handed_leases() -> None:
    """Release the leases held for the flow (it took its own, and has ended)."""
    while _handed_leases:
        _handed_leases.pop().close()
