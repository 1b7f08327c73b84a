"""Map an exception to what it means for a chunk and for the run: the one place that does.

``status_for`` is the only function that looks at arbitrary exceptions: unknown errors are
``failed`` (and logged with their traceback by the caller), never retried, because a retried
bug spends API budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from embedline.errors import (
    DiskFullError,
    EmbedlineError,
    EndpointDownError,
    FatalError,
    InputError,
    RetryableError,
    RetryLaterError,
    StopRequestedError,
    WorkerLostError,
)

__all__ = [
    "ChunkFailure",
    "FailureKind",
    "group_retry_condition",
    "name_the_worker",
    "retry_condition",
    "retryable",
    "status_for",
    "stops_group",
]

FailureKind = Literal["fatal", "input", "outage", "failed", "released"]


@dataclass(frozen=True, slots=True)
class ChunkFailure:
    """A failed chunk: ``kind`` says what the run does next; ``error`` is for the ledger.

    ``fatal`` stops dispatching and exits 3; ``input`` stops and exits 2; ``outage`` (the
    embedding endpoint went down mid-run, or a filesystem written is full) marks the chunk failed
    and stops dispatching, exit 1, a rerun resumes; ``failed`` marks
    the chunk failed (a rerun retries it) and the run goes on; ``released`` gives the chunk
    back as pending (the run is stopping, or the server asked for a wait above the cap).
    """

    kind: FailureKind
    error: str
    expected: bool  # False for an exception embedline does not know: a bug, log its traceback
    requests: int = 0  # HTTP requests the chunk sent before failing, retries included
    tokens: int = 0  # tokens the server reported for them


def status_for(exc: BaseException) -> ChunkFailure:
    """Classify ``exc`` (raised by a chunk task) into a ``ChunkFailure``."""
    text = f"{type(exc).__name__}: {exc}"
    cost = {
        "requests": int(getattr(exc, "requests", 0) or 0),
        "tokens": int(getattr(exc, "tokens", 0) or 0),
    }
    if isinstance(exc, FatalError):
        return ChunkFailure("fatal", text, expected=True, **cost)
    if isinstance(exc, InputError):
        return ChunkFailure("input", text, expected=True, **cost)
    if isinstance(exc, (EndpointDownError, DiskFullError, WorkerLostError)):  # so would later
        return ChunkFailure("outage", text, expected=True, **cost)
    if isinstance(exc, (StopRequestedError, RetryLaterError)):
        return ChunkFailure("released", text, expected=True, **cost)
    if isinstance(exc, EmbedlineError):
        return ChunkFailure("failed", text, expected=True, **cost)
    return ChunkFailure("failed", text, expected=False)


def retry_condition(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a chunk task only for a ``RetryableError``.

    Row-permanent, bad-response, fatal, input and unknown errors are never retried by
    Prefect (docs: how-to-guides/workflows/retries, "retry_condition_fn").
    """
    return retryable(state.result(raise_on_failure=False))


def group_retry_condition(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn`` of a group of chunks (``tasks.embed.groups``): retry
    when a chunk of the group failed with a ``RetryableError`` and none with an error that
    stops the run (its retry runs only the chunks that failed so: ``tasks.embed.task``)."""
    outcome = state.result(raise_on_failure=False)
    failures = getattr(outcome, "failures", None)
    if failures is None:  # the group itself failed, outside any chunk
        return retryable(outcome)
    errors = failures()
    return any(retryable(e) for e in errors) and not any(stops_group(e) for e in errors)


def retryable(exc: object) -> bool:
    """Whether a chunk that failed with ``exc`` is retried by Prefect: a ``RetryableError``
    but for a wait above the cap (``RetryLaterError``: release, do not spin) and an open
    circuit breaker (``EndpointDownError``: a retry would be refused unsent), nor a task
    whose process went away (``WorkerLostError``)."""
    return isinstance(exc, RetryableError) and not isinstance(
        exc, (RetryLaterError, EndpointDownError, WorkerLostError)
    )


def stops_group(exc: BaseException) -> bool:
    """Whether a group of chunks stops at a chunk that failed with ``exc``, its later chunks
    not started: the run stops (fatal, input, outage) or the chunk was released (the run is
    stopping, or the server asked for a wait above the cap, which its next chunks would get
    too)."""
    return status_for(exc).kind != "failed"


def name_the_worker(exc: FatalError, worker: str | None) -> None:
    """Add ``worker`` (``tasks.embed.dask_worker.worker_label``; None: not on a worker) to the
    message of ``exc``, raised by a chunk task on a cluster started apart: each worker has
    its own environment, so a key the API refuses or AWS settings S3 refuses may be that
    worker's alone, while the shell that started the run has good ones."""
    if worker is None:
        return
    exc.message = f"{exc.message} (the chunk ran on {worker}: check that worker's environment)"
    exc.args = (exc.message, *exc.args[1:])
