"""Failure classes (docs/reference/failure-classes.md). Every adapter translates third-party errors
into these.

::

    EmbedlineError            base; attributes chunk_index, row_number (None when unknown)
     ├─ InputError            bad CSV, header, encoding or parameter → exit 2 before any API call
     ├─ RowError              one row unusable (empty, too long, rejected) → dead letter
     ├─ RetryableError        timeouts, resets, 408/409/425/429/5xx, non-JSON bodies → retried
     │   ├─ RateLimitedError  429 with a server-given wait (retry_after_s, seconds)
     │   ├─ RetryLaterError   a server wait above the cap → chunk released, not slept
     │   └─ EndpointDownError the endpoint stopped accepting connections mid-run (circuit
     │                        breaker open) → no more chunks, exit 1, a rerun resumes
     ├─ BadResponseError      2xx with wrong count/index/dimensions or NaN/Inf → chunk failed
     ├─ StopRequestedError    the run is stopping (SIGINT/SIGTERM) → chunk released, rerun resumes
     ├─ FatalError            401/403, insufficient_quota, unknown model, store refusals → exit 3
     │   ├─ RequestRejectedError  a 4xx for the request itself, not one input → exit 3
     │   ├─ CostCapError      the next request would take the spend above --max-cost → exit 3,
     │   │                    published chunks kept, a rerun with a higher cap resumes
     │   ├─ UnknownBatchError a batch or file id the ledger recorded is a 404 at the Batch
     │   │                    API (another key or account, purged, deleted) → exit 3
     │   └─ ConflictError     an object at our key holds other bytes → never overwritten
     ├─ DiskFullError         a write met a full filesystem (ledger, scratch, output, sink)
     │                        → exit 1, one line naming the path; a rerun after freeing
     │                        space resumes
     └─ RunIncompleteError    the run ended with failed chunks or dead letters → exit 1

Messages never contain input text, API keys or credentials: only ids, line numbers, column
names, HTTP statuses and keys.

Every error also carries ``requests`` and ``tokens``: the HTTP requests sent (retries
included) and the tokens the server reported for the work that ended in this error, so a run
counts what it paid for even when a chunk fails (0 when nothing was sent).
"""

from __future__ import annotations

__all__ = [
    "BadResponseError",
    "ConflictError",
    "CostCapError",
    "DiskFullError",
    "EmbedlineError",
    "EndpointDownError",
    "FatalError",
    "InputError",
    "RateLimitedError",
    "RequestRejectedError",
    "RetryLaterError",
    "RetryableError",
    "RowError",
    "RunIncompleteError",
    "StopRequestedError",
    "UnknownBatchError",
    "WorkerLostError",
]


class EmbedlineError(Exception):
    """Base of every embedline error; ``chunk_index`` and ``row_number`` when known."""

    exit_code = 1
    requests = 0  # HTTP requests sent for the failed work, retries included
    inputs = 0  # texts in those requests
    tokens = 0  # tokens the server reported for it

    def __init__(
        self, message: str, *, chunk_index: int | None = None, row_number: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.chunk_index = chunk_index
        self.row_number = row_number

    def __reduce__(self) -> tuple[object, ...]:  # keep keyword attributes across pickling
        return (_rebuild, (type(self), self.__dict__))


def _rebuild(cls: type[EmbedlineError], state: dict[str, object]) -> EmbedlineError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message", ""))
    err.__dict__.update(state)
    return err


class InputError(EmbedlineError):
    """Raised when the input file, its header, encoding, a row or a parameter is unusable.

    ``path`` names the file, ``line`` the 1-based physical line where the offending record
    starts (header = line 1), ``column`` the column name when one is at fault.
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        where = ":".join(str(p) for p in (path, line) if p is not None)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.line = line
        self.column = column


class RowError(EmbedlineError):
    """Raised when one row can never be embedded; it becomes a dead letter.

    ``reason`` is a short machine-readable word (``empty_text``, ``rejected``,
    ``too_long``); ``http_status`` is the server's answer, if any.
    """

    def __init__(
        self,
        reason: str,
        *,
        http_status: int | None = None,
        detail: str = "",
        row_number: int | None = None,
    ) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason, row_number=row_number)
        self.reason = reason
        self.http_status = http_status


class RetryableError(EmbedlineError):
    """Raised when a request may succeed if sent again (timeouts, 408/409/425/429/5xx)."""

    def __init__(
        self,
        message: str,
        *,
        http_status: int | None = None,
        retry_after_s: float | None = None,
        chunk_index: int | None = None,
    ) -> None:
        super().__init__(message, chunk_index=chunk_index)
        self.http_status = http_status
        self.retry_after_s = retry_after_s


class RateLimitedError(RetryableError):
    """Raised on 429 rate limiting; ``retry_after_s`` is the server's wait in seconds."""


class RetryLaterError(RetryableError):
    """Raised when the server's wait (``retry_after_s``) exceeds the configured maximum.

    Not slept inside a task: the chunk is released as retryable-later and the run reports it.
    """


class EndpointDownError(RetryableError):
    """Raised when the embedding endpoint answered earlier requests of this run and then
    refused every connection of one call (``max_attempts`` connect failures over its
    backoff): the server went down. The client's circuit breaker opens: every later call
    raises this at once, without sending; the run dispatches no more chunks and exits 1,
    and a rerun resumes. Never retried within the run (neither per request nor per task).
    """


class WorkerLostError(RetryableError):
    """Raised for a chunk task that never reported its end because its process went away:
    the client lost the Dask scheduler, or the task's worker died as often as Dask allows
    (``KilledWorker``; a worker killed once has its tasks run again elsewhere). The task run
    still reads Running. Its chunk is not published; like ``EndpointDownError`` the run
    dispatches no more chunks (without a scheduler none could run) and exits 1, and a rerun
    resumes. Never retried within the run.
    """


class BadResponseError(EmbedlineError):
    """Raised when a 2xx body has the wrong count, index, dimensions, or NaN/Inf values."""


class StopRequestedError(EmbedlineError):
    """Raised inside a chunk task when the run is stopping; the chunk is released, not failed."""


class FatalError(EmbedlineError):
    """Raised when retrying cannot help (401/403, quota, unknown model, store refusals)."""

    exit_code = 3

    def __init__(
        self, message: str, *, http_status: int | None = None, chunk_index: int | None = None
    ) -> None:
        super().__init__(message, chunk_index=chunk_index)
        self.http_status = http_status


class RequestRejectedError(FatalError):
    """Raised when the server answers the same 4xx to a batch and to its rows sent alone.

    The request itself is refused (an unsupported parameter such as ``dimensions``, a wrong
    deployment), not an input: dead-lettering every row would make the rejection final, so
    the run stops instead (exit 3) and publishes nothing for the affected chunks.
    """


class CostCapError(FatalError):
    """Raised before a request that would take what the run spent above ``--max-cost``
    (``adapters.embeddings.spend``): nothing more is sent; what is published stays."""


class UnknownBatchError(FatalError):
    """Raised when the Batch API answers 404 for a batch or file id embedline recorded: it
    was created with another API key (organization, project) or ``--base-url``, or the
    provider no longer has it (purged, deleted). Never resubmitted behind the user's back:
    under another key the batch may still run and bill. ``batch_id`` or ``file_id`` names
    it (the other is None); ``where`` is the base URL without credentials; ``cause`` is the
    message without what to do (the caller's advice differs: a run, ``cancel-batches``).
    """

    #: What a run tells the user to do (``cancel-batches`` says its own).
    RUN_ADVICE = (
        "rerun with the API key and --base-url that created it, or, if the "
        "provider no longer has it, rerun without --batch-api to embed what is left "
        "synchronously (full price)"
    )

    def __init__(
        self, *, where: str, batch_id: str | None = None, file_id: str | None = None
    ) -> None:
        what = f"batch {batch_id}" if batch_id is not None else f"file {file_id}"
        cause = (
            f"{what} is unknown to {where} (HTTP 404): it was created with another API "
            "key (organization, project) or --base-url, or the provider no longer has it"
        )
        super().__init__(f"{cause}; {self.RUN_ADVICE}", http_status=404)
        self.cause, self.where = cause, where
        self.batch_id, self.file_id = batch_id, file_id


class ConflictError(FatalError):
    """Raised when an object already at our key holds different bytes; it is never replaced."""


class DiskFullError(EmbedlineError):
    """Raised when a write meets a full filesystem (ENOSPC/EDQUOT, SQLite's SQLITE_FULL):
    an environment problem that a rerun fixes once space is freed, so exit 1 (as an endpoint
    outage), not 3. ``path``: what was being written. Built by ``adapters.disk_full``.
    """

    exit_code = 1

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class RunIncompleteError(EmbedlineError):
    """Raised when a run ends with failed chunks or dead letters; the manifest is not written.

    ``summary`` is the run's summary dict (counts only, no text).
    """

    exit_code = 1

    def __init__(self, message: str, *, summary: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.summary = summary or {}
