"""Progress events from the flow to whoever shows them (the CLI's progress bar or lines).

The flow calls ``notify``; a listener registered with ``listen`` receives each event. With no
listener (a deployment run), events cost one function call. Events carry counts only.

Batch progress: a chunk task wraps its embedding client with ``counting``, which adds the
rows of every successful request to a per-chunk count in this process. The flow reads
``partial_rows`` on its own thread (every dispatcher tick), so progress moves per batch, not
per chunk. With Dask the tasks run in other processes: their counts stay there, and the
flow's progress moves per chunk (never wrong, only coarser).

Cost: the same wrapper adds every call's HTTP requests, the reported tokens and the texts
to a process-wide count (``Usage``), failed calls too, so the run's summary counts what chunks
that failed, were retried by Prefect or were released at a stop paid for (``cost_in_process``;
the chunks' outcomes only carry their last attempt's). The texts are split by what the
provider did with them: ``inputs`` it answered with vectors (charged), ``inputs_retried`` those
of requests that got no vectors (rate limited, a server error, a timeout: not charged, sent
again or given up). A request still on the wire when the summary is made is not in it.

Rate: ``Throughput`` turns the rows done into rows/s over a recent window and an ETA, for the
progress artifact and the CLI's lines alike.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embedline.errors import FatalError
    from embedline.protocols import EmbeddingClient, RequestLimits

__all__ = [
    "PROGRESS_LOGGER",
    "BatchCount",
    "Progress",
    "Throughput",
    "Usage",
    "batches_phrase",
    "chunk_started",
    "cost_in_process",
    "counting",
    "duration_phrase",
    "listen",
    "notify",
    "partial_rows",
    "reset_cost",
]

# Lines a user waits on from inside an adapter (an index build's progress): INFO, and shown.
# Prefect copies its handlers to the "embedline" logger (PREFECT_LOGGING_EXTRA_LOGGERS) but
# not a level, so its INFO lines (a PUT per object) stay hidden; this child is set to INFO.
PROGRESS_LOGGER = "embedline.progress"


@dataclass(frozen=True, slots=True)
class BatchCount:
    """Batch API batches in one ``status`` (the provider's, or ``creating``): how many, the
    requests they hold and how many of those the provider reports done."""

    status: str
    batches: int
    requests: int
    completed: int


@dataclass(frozen=True, slots=True)
class Progress:
    """Run progress: rows and chunks done out of the totals; ``skipped`` were published before.
    ``batches``: while the Batch API stage waits (``--batch-api``), the run's batches by
    status; empty otherwise."""

    rows_total: int
    chunks_total: int
    rows_done: int
    chunks_done: int
    rows_skipped: int
    dead_letters: int
    chunks_failed: int
    batches: tuple[BatchCount, ...] = ()


def batches_phrase(batches: Sequence[BatchCount]) -> str:
    """``batches 2 in_progress (1 of 4 requests done), 1 completed (2 of 2 requests done)``;
    empty when there are none."""
    if not batches:
        return ""
    return "batches " + ", ".join(
        f"{b.batches:,} {b.status} ({b.completed:,} of {b.requests:,} requests done)"
        for b in batches
    )


class Throughput:
    """Rows/s over the last ``window_s`` seconds of ``observe`` calls, and the ETA it gives.

    A recent window, not the run's average: a run that slowed down (rate limited, a Batch API
    wait) says so within a minute, and the rows skipped at the start (published before) count
    for nothing. ``clock`` is injectable (seconds, monotonic) for tests. Not thread-safe:
    one feed (the dispatcher's thread) calls it.
    """

    def __init__(
        self, *, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._seen: deque[tuple[float, int]] = deque()  # (time, rows done), oldest first

    def observe(self, rows_done: int) -> None:
        """Record that ``rows_done`` rows are done now; samples older than the window go,
        but the newest of them stays as the window's start."""
        now = self._clock()
        self._seen.append((now, rows_done))
        while len(self._seen) > 2 and self._seen[1][0] <= now - self.window_s:
            self._seen.popleft()

    def rows_per_s(self) -> float | None:
        """Rows per second over the window; None until two samples a moment apart."""
        if len(self._seen) < 2:
            return None
        (start, first), (end, last) = self._seen[0], self._seen[-1]
        if end - start < 1e-3:
            return None
        return max(0, last - first) / (end - start)

    def eta_s(self, rows_total: int) -> float | None:
        """Seconds until ``rows_total`` at the window's rate: 0 once done, None while the
        rate is unknown or zero."""
        if not self._seen:
            return None
        left = rows_total - self._seen[-1][1]
        if left <= 0:
            return 0.0
        rate = self.rows_per_s()
        return left / rate if rate else None


def duration_phrase(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:,.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


_listener: Callable[[Progress], None] | None = None


def listen(callback: Callable[[Progress], None] | None) -> None:
    """Register ``callback`` for progress events (None removes it)."""
    global _listener
    _listener = callback


def notify(event: Progress) -> None:
    """Send ``event`` to the registered listener, if any."""
    if _listener is not None:
        _listener(event)


_partial: dict[int, int] = {}  # chunk index -> rows embedded so far by its running task
_partial_lock = threading.Lock()


def chunk_started(index: int) -> None:
    """A chunk task (re)starts: its earlier partial count (a failed attempt) is void."""
    with _partial_lock:
        _partial[index] = 0


def _add_rows(index: int, rows: int) -> None:
    with _partial_lock:
        _partial[index] = _partial.get(index, 0) + rows


def partial_rows(finished: Collection[int]) -> int:
    """Rows embedded so far by chunks of this process that are not in ``finished``; the
    counts of finished chunks are dropped (their rows are counted by the caller)."""
    with _partial_lock:
        for index in [i for i in _partial if i in finished]:
            del _partial[index]
        return sum(_partial.values())


@dataclass(frozen=True, slots=True)
class Usage:
    """What a run's ``embed`` calls asked of the provider: ``requests`` (HTTP requests,
    retries included), ``tokens`` (as the provider reported them), ``inputs`` (texts in the
    requests it answered with vectors: what it charges for), ``requests_retried`` and
    ``inputs_retried`` (requests that got no vectors: rate limited, a server error, a
    timeout; sent again or given up, not charged). An in-process model sends no request:
    its inputs are the texts it embedded. ``batch_tokens`` and ``batch_inputs``: of
    ``tokens`` and ``inputs``, those Batch API batches answered (billed at the batch price),
    failed chunks' included."""

    requests: int = 0
    tokens: int = 0
    inputs: int = 0
    requests_retried: int = 0
    inputs_retried: int = 0
    batch_tokens: int = 0
    batch_inputs: int = 0


_cost = [0, 0, 0, 0, 0, 0, 0]  # Usage's fields, in order, of every embed call since reset_cost()


def reset_cost() -> None:
    """Start counting a run's requests and tokens from zero (the flow, before dispatching)."""
    with _partial_lock:
        _cost[:] = [0] * 7


def cost_in_process() -> Usage:
    """The ``Usage`` of every ``embed`` call made through ``counting`` clients in this
    process since ``reset_cost``: successful, failed and released chunks alike."""
    with _partial_lock:
        return Usage(*_cost)


def _add_cost(source: object, texts: int | None) -> None:
    """Add the ``requests``, ``tokens`` and ``inputs`` of an ``Embeddings`` (``texts``: the
    call's texts, all answered) or of an error (``texts`` None: nothing answered)."""
    requests = int(getattr(source, "requests", 0) or 0)
    tokens = int(getattr(source, "tokens", 0) or 0)
    inputs = int(getattr(source, "inputs", 0) or 0)
    if texts is None:  # a failed call: every request it sent went unanswered
        charged, retried, resent = 0, requests, inputs
    else:  # one answered request; the attempts before it (and their texts) were not
        charged, retried, resent = texts, max(0, requests - 1), max(0, inputs - texts)
    batch = (0, 0)  # a failed call: no batch answer handed out
    if texts is not None:
        batch = (int(getattr(source, "batch_tokens", 0)), int(getattr(source, "batch_inputs", 0)))
    with _partial_lock:
        for n, value in enumerate((requests, tokens, charged, retried, resent, *batch)):
            _cost[n] += value


class _CountingClient:
    """An embedding client that counts the rows of each successful ``embed`` call, and the
    requests and tokens of every call. A client that takes a whole chunk in one call
    (``whole_chunk``: the local model) counts rows per forward pass instead (``on_rows``):
    per call, the bar would sit still for a whole chunk (about 30 s at chunk size 1000)."""

    def __init__(self, client: EmbeddingClient, index: int) -> None:
        self._client = client
        self._index = index
        self.model = client.model
        self.dimensions = client.dimensions

    @property
    def caps(self) -> RequestLimits | None:
        """The wrapped client's learned limits."""
        return self._client.caps

    @property
    def whole_chunk(self) -> bool:
        """The wrapped client's choice of one call per chunk."""
        return self._client.whole_chunk

    @property
    def accepted_requests(self) -> int | None:
        """The wrapped client's count of answered requests."""
        return self._client.accepted_requests

    def stop(self, error: FatalError) -> None:
        """Latch the wrapped client."""
        self._client.stop(error)

    def close(self) -> None:
        """Close the wrapped client."""
        self._client.close()

    def embed(self, texts: Sequence[str], **kwargs: Any) -> Any:
        per_pass = self._client.whole_chunk  # a chunk in one call: minutes
        if per_pass:
            kwargs["on_rows"] = functools.partial(_add_rows, self._index)
        try:
            result = self._client.embed(texts, **kwargs)
        except BaseException as exc:  # an EmbedlineError carries what the call sent
            _add_cost(exc, None)
            raise
        _add_cost(result, len(texts))
        if not per_pass:
            _add_rows(self._index, len(texts))
        return result


def counting(client: EmbeddingClient | None, index: int) -> EmbeddingClient | None:
    """Wrap ``client`` (an ``EmbeddingClient``) so chunk ``index``'s rows count as they are
    embedded; ``None`` stays ``None``."""
    chunk_started(index)
    return None if client is None else _CountingClient(client, index)
