"""A run's outcome from its chunks' outcomes: the counts and the status its summary carries.

Pure: no I/O, no Prefect. ``Run.conclude`` turns these fields into the run's summary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedline.interrupts import exit_code_for
from embedline.models import (
    ChunkOutcome,
    DeltaBase,
    InputPlan,
    blocking_dead_letters,
    dead_letters_block_message,
)
from embedline.progress import Usage
from embedline.shutdown import STOP
from embedline.summary import tokens_avoided
from flows.dispatch import DispatchResult

if TYPE_CHECKING:
    from tasks.embed.failures import ChunkFailure

__all__ = ["outcome_fields", "with_inherited"]


def outcome_fields(
    plan: InputPlan,
    run_key: str,
    skipped: dict[int, ChunkOutcome],
    result: DispatchResult,
    *,
    cost: Usage | None = None,
    on_empty_text: str = "skip",
    resume_hint: str = "rerun the same command to resume",
) -> dict[str, Any]:
    """The ``RunSummary`` fields of a run whose chunks ``skipped`` were published before it
    and whose dispatch ended with ``result``: counts (rows, chunks, requests, tokens, inputs)
    and ``exit_code``/``status``/``message``.

    ``cost``, when given, is what the run's chunk tasks sent (``Usage``: this process's
    tally with threads, the store's spend records on Dask), which the outcomes undercount
    after failures and lost workers; without it (Batch API mode on Dask) requests not
    answered are not counted. ``tokens_saved`` is computed by ``tokens_avoided``. Empty
    texts block the commit only with ``on_empty_text="fail"``. A status of ``complete``
    (exit 0) means: ready to commit. A run that did not complete and leaves Batch API
    batches running at the provider (``STOP.report.left_running``) ends its message with
    how many and how to collect or cancel them, whatever stopped it.
    """
    done = {**skipped, **result.published}
    concurrent = result.published_elsewhere  # also in ``skipped``
    attempts: list[ChunkOutcome | ChunkFailure] = [
        *result.published.values(),
        *result.failed.values(),
        *result.released.values(),
    ]
    usage = cost or Usage(
        requests=sum(o.requests for o in attempts),
        tokens=sum(o.tokens for o in attempts),
        inputs=sum(o.inputs for o in result.published.values()),
    )
    avoided = sum(o.reused + o.deduplicated for o in result.published.values())
    dead = [d for o in done.values() for d in o.dead_letters]
    rows_failed, blocking = len(dead), blocking_dead_letters(dead, on_empty_text)
    not_done = len(plan.chunks) - len(done)
    counts = dict(
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
        tokens=usage.tokens,
        requests=usage.requests,
        inputs=usage.inputs,
        requests_retried=usage.requests_retried,
        inputs_retried=usage.inputs_retried,
        rows_reused=sum(o.reused for o in result.published.values()),
        rows_deduplicated=sum(o.deduplicated for o in result.published.values()),
        **tokens_avoided(
            avoided,
            estimated=sum(o.tokens_saved for o in result.published.values()),
            reported=sum(o.tokens for o in result.published.values() if o.tokens_bound),
            bound=sum(o.tokens_bound for o in result.published.values()),
        ),
        # what batches answered, failed chunks' too (this process's tally; on Dask, the
        # published chunks')
        batch_tokens=usage.batch_tokens or sum(o.batch_tokens for o in result.published.values()),
        batch_inputs=usage.batch_inputs or sum(o.batch_inputs for o in result.published.values()),
    )
    status = _status(plan, run_key, done, result, not_done, blocking, resume_hint)
    left = STOP.report.left_running()  # Batch API batches this run leaves running at the provider
    if status["exit_code"] and left and left not in status["message"]:
        status["message"] += f"; {left}"
    return {**counts, **status}


def with_inherited(fields: dict[str, Any], delta: DeltaBase | None) -> dict[str, Any]:
    """``outcome_fields`` of a delta night (docs/design.md, "Delta nights") with what it
    inherits: the rows the base's objects give count as published and skipped, the input's
    empty texts (written to no chunk) as failed; a full night's fields as they are."""
    if delta is None:
        return fields
    return {
        **fields,
        "rows_published": fields["rows_published"] + delta.rows_inherited,
        "rows_skipped": fields["rows_skipped"] + delta.rows_inherited,
        "rows_failed": fields["rows_failed"] + delta.rows_empty,
        "rows_empty": fields["rows_empty"] + delta.rows_empty,
        "rows_inherited": delta.rows_inherited,
        "delta_base": delta.base_run_key,
    }


def _status(
    plan: InputPlan,
    run_key: str,
    done: dict[int, ChunkOutcome],
    result: DispatchResult,
    not_done: int,
    blocking: int,
    resume_hint: str,
) -> dict[str, Any]:
    """``exit_code``, ``status`` and ``message``: the first of a stop by signal, the Prefect
    API lost, a stop of the dispatch (outage, fatal, input), chunks not published, dead
    letters that block the commit; else ``complete``."""
    published = f"{len(done)} of {len(plan.chunks)} chunks"
    signum = STOP.dispatch.stop_signal()
    if signum is not None:
        return _ended(
            exit_code_for(signum),
            "interrupted",
            f"{STOP.stop_cause(signum)}: {published} published; {resume_hint}",
        )
    loss = STOP.report.api_lost()
    if loss is not None and not_done:
        return _ended(
            1, "interrupted", f"{loss.what}; {published} are published and kept: {loss.todo}"
        )
    if result.stop is not None and result.stop.kind == "outage":
        running = (
            f"; {result.still_running} more were still running on the cluster's workers when "
            "this command stopped waiting: the rerun waits for them"
            if result.still_running
            else ""
        )
        return _ended(
            1,
            "incomplete",
            f"stopped: {result.stop.error}; {published} are published and kept{running}",
        )
    if result.stop is not None:
        return _ended(
            3 if result.stop.kind == "fatal" else 2,
            result.stop.kind,
            f"stopped: {result.stop.error}",
        )
    if not_done:
        return _ended(
            1,
            "incomplete",
            (
                f"{not_done} of {len(plan.chunks)} chunks not published{_why(result)}; rerun the "
                "same command to retry only those chunks"
            ),
        )
    if blocking:
        return _ended(1, "dead_letters", dead_letters_block_message(blocking, run_key))
    return _ended(0, "complete", "")


def _ended(exit_code: int, status: str, message: str) -> dict[str, Any]:
    return {"exit_code": exit_code, "status": status, "message": message}


def _why(result: DispatchResult) -> str:
    """`` (N failed; chunk I: error)`` for the lowest failed chunk, or ``""``: the summary
    says what went wrong, not only the log."""
    if not result.failed:
        return ""
    first = min(result.failed)
    return f" ({len(result.failed)} failed; chunk {first}: {result.failed[first].error})"
