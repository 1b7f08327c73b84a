"""What ``embedline run`` finishes before Prefect starts, through the run driver
(``flows.driver``) as the flow would: a run already committed (and, with ``--sink``, already
loaded), or a run with nothing to send and no sink. Otherwise the run needs the flow: what
was prepared for it (the plan, the reuse stage, the run's record and lease) goes into one
``flows.session.Session`` that the command hands to the flow."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from flows.driver import HandedToFlow, Steps

if TYPE_CHECKING:
    from cli.plan_ahead import PlanAhead
    from embedline.settings import RunSettings
    from embedline.summary import RunSummary
    from flows.dispatch import Dispatched
    from flows.run import Run, Work
    from flows.session import Session

__all__ = ["run_without_prefect"]


def run_without_prefect(
    settings: RunSettings,
    *,
    emit_events: bool,
    ahead: PlanAhead | None = None,
) -> dict[str, Any] | tuple[str, int] | Session:
    """What ``run`` finishes before Prefect starts (module docstring): the run's summary (a
    committed run writes nothing to the store, as docs/reference/output-layout.md asks; the
    ledger catches up if it lags the store); (message, exit code) for an input or store
    error; else the session the flow takes over, in this process. ``emit_events``: send
    ``embedline.run.committed`` for a commit (False with the CLI's temporary server, which
    runs no automations and is stopped when the command ends). ``ahead``: the plan comes
    from that child process instead (``cli/plan_ahead.py``).
    """
    import logging
    import time

    from adapters.csv_source import plan_csv
    from adapters.object_store import open_store
    from embedline.errors import EmbedlineError
    from flows.driver import drive
    from flows.run import Run
    from flows.session import Session

    started = time.monotonic()
    steps = _CommandSteps(emit_events)

    def opened(**again: Any) -> Run:
        steps.opened = Run.open(
            settings,
            store=open_store(settings.output),
            plan_input=ahead.plan
            if ahead is not None
            else lambda s: plan_csv(s.input, **s.plan_arguments),
            log=logging.getLogger("embedline.run"),
            started=started,
            **again,
        )
        return steps.opened

    try:
        summary = drive(opened, steps)
    except HandedToFlow as handed:
        run = steps.opened
        assert run is not None, "handed to the flow before the run was open"
        session = Session.for_plan(settings, run.plan)
        session.run_key = run.run_key
        session.stage, session.stage_chunks = handed.stage, handed.stage_chunks
        session.lease, session.hard_exit_hook = handed.lease, handed.hard_exit_hook
        return session
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    except OSError:
        if steps.opened is not None:
            raise
        return Session(settings)  # let the flow report it with its full context
    if summary.run_key is None:  # refused by ``Run.open``: nothing started
        return summary.message, summary.exit_code
    return summary.to_dict()


class _CommandSteps(Steps):
    """The command's steps before Prefect: no flow run; a run with a sink, or chunks to
    send, goes to the flow; a committed run's load too, unless the sink holds it already."""

    def __init__(self, emit_events: bool) -> None:
        self.emit_events = emit_events
        self.opened: Run | None = None

    def before_record(self, run: Run) -> None:
        if run.settings.sink:  # the flow records, embeds, commits and loads it
            raise HandedToFlow
        try:
            run.open_ledger()
        except (OSError, sqlite3.Error):
            raise HandedToFlow from None  # the flow reports it with its full context

    def before_lease(self, run: Run) -> None:
        """A run with chunks to send that may not be published here goes to the flow before
        anything is leased: the flow leases it for as long as it runs."""
        from flows.copied_run import may_publish_here

        work = run.work_left()
        if run.needs_dispatch(work) and not may_publish_here(run, work):
            raise HandedToFlow

    def dispatch(self, run: Run, work: Work) -> Dispatched:
        """Nothing to send: nothing dispatched. Every row copied: published here
        (``flows.copied_run``). Else the flow dispatches."""
        from flows.copied_run import may_publish_here, publish_if_all_copied
        from flows.dispatch import Dispatched, DispatchResult

        if not run.needs_dispatch(work):
            return Dispatched(DispatchResult(), None)
        if not may_publish_here(run, work):
            raise HandedToFlow
        return publish_if_all_copied(run, work)

    def load(self, run: Run, manifest: dict[str, Any], summary: RunSummary) -> RunSummary:
        """A committed run whose sink already holds it (``tasks.load.sink_state.left_to_load``,
        read here); else the flow loads it."""
        from cli.load import already_loaded

        settings = run.settings
        assert settings.sink is not None
        loaded = already_loaded(
            settings.output,
            run.run_key,
            settings.sink,
            settings.ledger,
            manifest=manifest,
            allow_failed_rows=settings.allow_failed_rows,
            index=settings.index,
        )
        if loaded is None:
            raise HandedToFlow
        return run.summary(summary, wall_s=summary.wall_s, load=loaded)
