"""The reuse stage of a run, and runs whose every chunk left is copied: no Prefect needed.

``prepare_stage`` builds the run's reuse stage (``tasks/reuse/stage.py``) for its work: the
index refreshed, every row planned, each reused vector copied once per source object. The
flow calls it (``flows.embed_and_publish``); so does ``embedline run`` before Prefect starts
(``cli/run_without_prefect.py``, ``run_without_prefect``), through ``publish_if_all_copied``:

- when every chunk left has every non-empty row copied (a shuffled or re-ordered export, a
  re-export cut at new chunk boundaries: a night that sends no request), the chunks are
  published here as the flow publishes them (``publish_copied_chunk`` on
  ``flows.local_chunks``, recorded by the same ``Dispatcher``) and the command concludes the
  run as it concludes one with nothing to embed. A flow run would only add Prefect's own
  costs: its engine, API calls and background threads and the running server's work, about
  1.3 of a 12 CPU s 1M-row night, and the import of the flow (0.8 CPU s) when the command
  has not made it yet;
- otherwise nothing is published here: the prepared stage goes with ``HandedToFlow`` into
  the command's session (``flows.session``) for the flow of the same run in this process
  (``take_stage``), so no row is planned or copied twice.

Prefect-free: imported by the CLI before it knows whether a flow will run.
"""

from __future__ import annotations

import contextlib
from typing import Any

from embedline.models import ChunkOutcome, ChunkSpec
from embedline.progress import cost_in_process, reset_cost
from flows.dispatch import Dispatched, Dispatcher
from flows.driver import HandedToFlow
from flows.local_chunks import LocalChunks
from flows.run import Run, Work
from flows.session import Session
from flows.signals import dispatch_with_graceful_stop
from tasks.reuse.copied_chunk import publish_copied
from tasks.reuse.stage import Log, ReuseStage

__all__ = [
    "may_publish_here",
    "prepare_stage",
    "publish_copied_chunk",
    "publish_if_all_copied",
    "take_stage",
]


def prepare_stage(run: Run, work: Work, log: Log) -> ReuseStage:
    """The run's reuse stage, prepared for ``work.todo``: the index refreshed, every row
    planned, the vectors to reuse copied once per source. ``log``: the stage's info lines.

    :raises DiskFullError: the scratch filesystem is full.
    :raises RetryableError, FatalError: the store failed.
    """
    settings = run.settings
    assert run.ledger is not None, "prepare_stage() of a run not recorded"
    stage = ReuseStage(
        store=run.store,
        ledger=run.ledger,
        plan=run.plan,
        run_key=run.run_key,
        model=settings.effective_model,
        dimensions=settings.dimensions,
        reuse=settings.reuse,
        length=work.length.current(),
        scratch_root=settings.scratch_root,
        log=log,
        shared_disk=settings.task_runner == "threads" or not settings.dask_address,
    )
    try:
        stage.prepare(work.todo)
    except BaseException:
        stage.close()
        raise
    return stage


def take_stage(run: Run, work: Work, log: Log, session: Session | None) -> ReuseStage | None:
    """The stage ``publish_if_all_copied`` prepared for this run and these chunks (in the
    command's ``session``), now the caller's (its ledger and log become ``run``'s and
    ``log``); None if there is none. A stage left for another run or other chunks is
    closed."""
    if session is None:
        return None
    stage = session.take_stage(run.run_key, tuple(s.index for s in work.todo))
    if stage is None:
        return None
    assert run.ledger is not None
    stage.ledger, stage.log = run.ledger, log
    for line in stage.said:
        log.info("%s, before the flow started", line)
    return stage


def publish_if_all_copied(run: Run, work: Work) -> Dispatched:
    """Publish ``work.todo`` without Prefect if every chunk of it has every non-empty row
    copied (module docstring): what the dispatch did, for ``Run.conclude``. Call it on a
    recorded run, under its lease (the stage reads earlier objects), once
    ``may_publish_here`` said yes (not asked again: it reads the store for chunk lengths).

    :raises HandedToFlow: the run needs the flow; it carries the prepared stage (for
        ``take_stage``).
    :raises DiskFullError: the scratch or ledger filesystem is full.
    :raises RetryableError, FatalError: the store failed while the stage read it.
    """
    stage = prepare_stage(run, work, run.log)
    if not all(stage.fully_copied(spec) for spec in work.todo):
        raise HandedToFlow(stage, tuple(s.index for s in work.todo))
    try:
        return _dispatch(run, work, stage)
    finally:
        stage.close()


def publish_copied_chunk(
    run: Run, work: Work, stage: ReuseStage, spec: ChunkSpec, logger: Any
) -> ChunkOutcome:
    """A chunk whose every row the reuse stage copied: from planning's rows and the copies
    (``tasks.reuse.copied_chunk``), else (kept columns, a copy that fails its hash check) the chunk
    task's body, in this process."""
    plan = stage.plan_for(spec)
    outcome = publish_copied(
        spec,
        run.plan.source,
        run.settings,
        store=run.store,
        scratch=run.plan.scratch,
        prefill=plan.prefill,
        width=plan.width,
        run_key=run.run_key,
        logger=logger,
    )
    if outcome is not None:
        return outcome
    from tasks.embed.task import run_chunk  # Prefect's task machinery: only when sending

    return run_chunk(
        spec, run.plan.source, run.settings, plan, work.length.current(), run.run_key, logger=logger
    )


def may_publish_here(run: Run, work: Work) -> bool:
    """Whether ``publish_if_all_copied`` may publish this run (else the caller leases,
    prepares and reads nothing before the flow): its settings allow it, planning's rows are
    at hand, the ledger already indexes objects of this output (a first run, or a fresh
    ledger, has nothing to copy from yet: its flow prepares the stage), and no
    chunk published before holds another vector length (the flow embeds those again)."""
    return (
        bool(work.todo)
        and run.settings.copies_in_process
        and run.plan.scratch is not None
        and run.ledger is not None
        and run.ledger.indexes_output(run.store.uri)
        and not run.redoes_lengths(work)
    )


def _dispatch(run: Run, work: Work, stage: ReuseStage) -> Dispatched:
    """Publish every chunk of ``work.todo`` on the copied chunks' pool, recorded as the
    flow records them; index what was published (the next run reads none of it)."""
    assert run.ledger is not None
    settings, log = run.settings, run.log
    reset_cost()  # a copy that fails its hash check is sent (publish_copied_chunk)
    copied = LocalChunks(lambda spec: publish_copied_chunk(run, work, stage, spec, log))
    with contextlib.closing(copied):
        dispatcher = Dispatcher(
            ledger=run.ledger,
            run_key=run.run_key,
            object_uri=lambda spec: run.store.uri_for(spec.object_key),
            submit=lambda group: [copied.submit(spec) for spec in group],
            window=settings.concurrency + 1,
            logger=log,
            on_outcome=lambda result: work.length.answered(result.published.values()),
            on_gave_up=stage.note_failed,
            grace_s=settings.grace_s,
        )
        result = dispatch_with_graceful_stop(
            dispatcher, work.todo, grace_s=settings.grace_s, logger=log
        )
    log.info(
        "%d chunks had every row copied: published before Prefect started, no request",
        copied.submitted,
    )
    stage.index_published(result.published.values())
    return Dispatched(result, cost_in_process())
