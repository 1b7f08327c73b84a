"""Embed one chunk's rows: skip empty texts, batch the rest, isolate rows the API rejects.

Pure chunk logic over an ``EmbeddingClient``: no Prefect, no store. The chunk task
(``tasks/embed/task.py``) wraps it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from adapters.embeddings import approximate_tokens, estimate_tokens
from embedline.errors import (
    BadResponseError,
    EmbedlineError,
    RequestRejectedError,
    RetryableError,
    RetryLaterError,
    RowError,
    StopRequestedError,
)
from embedline.keys import request_key, row_key
from embedline.models import DeadLetter, Row
from embedline.protocols import EmbeddingClient, RequestLimits
from embedline.shutdown import tasks_must_stop
from tasks.embed.paid import PaidRequests

__all__ = ["EmbeddedRows", "batches", "embed_rows", "merged"]


@dataclass(slots=True)
class EmbeddedRows:
    """A chunk after embedding: ``rows`` kept (input order) and their ``vectors``.

    ``vectors`` is float32 of shape ``(len(rows), dimensions)``; ``row_keys`` are the rows'
    idempotency keys; ``tokens`` as reported by the API; ``requests`` HTTP attempts made;
    ``tokens_estimated`` the ``approximate_tokens`` of the texts whose answers reported
    ``tokens`` (for the token calibration, ``embedline.calibration``), ``tokens_bound`` their
    ``estimate_tokens`` (UTF-8 bytes / 3).
    """

    rows: list[Row]
    vectors: np.ndarray
    row_keys: list[str]
    dead_letters: list[DeadLetter] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    tokens_estimated: int = 0
    tokens_bound: int = 0


def batches(
    rows: Sequence[Row],
    *,
    batch_size: int,
    max_request_tokens: int,
    caps: RequestLimits | None = None,
) -> Iterator[list[Row]]:
    """Split ``rows`` into consecutive batches of at most ``batch_size`` rows and at most
    ``max_request_tokens`` estimated tokens (a single larger row goes alone), each lowered
    by the ``caps`` learned so far (read again before every batch)."""
    batch: list[Row] = []
    budget = 0
    limit_rows, limit_tokens = batch_size, max_request_tokens
    for row in rows:
        if not batch and caps is not None:
            limit_rows, limit_tokens = caps.limits(batch_size, max_request_tokens)
        tokens = estimate_tokens(row.text)
        if batch and (len(batch) >= limit_rows or budget + tokens > limit_tokens):
            yield batch
            batch, budget = [], 0
            if caps is not None:
                limit_rows, limit_tokens = caps.limits(batch_size, max_request_tokens)
        batch.append(row)
        budget += tokens
    if batch:
        yield batch


class _Embedder:
    """Sends batches and isolates the rows that make a batch fail.

    Row-permanent answers (400/413/422) bisect the batch until each rejected row stands
    alone. A 500 that outlives the retry budget is bisected the same way, but only while one
    half succeeds: when both halves fail the server is down rather than choking on a row, and
    the error propagates (the chunk fails and a rerun retries it) instead of dead-lettering
    healthy rows. So one poison row cannot sink its chunk, and an outage costs at most three
    retried requests per batch.

    Request-level rejections: until the server has accepted any request of this run, a
    rejected batch first sends its first rows alone. Two different rows rejected alone with
    the same status and message, while nothing was ever accepted, mean the server refuses
    the request itself (an unsupported parameter, a wrong deployment), not these inputs:
    ``RequestRejectedError`` (exit 3) instead of a chunk of final dead letters. Cost: the
    batch and two single-row requests. Limitation: a run whose first two rows are both
    rejected for the same reason is stopped too (its message quotes the server).

    Learned caps: a rejected batch whose rows all went through in smaller requests was too
    big, not bad; the largest request that worked is remembered in the client's
    ``RequestCaps`` for the rest of the run.
    """

    def __init__(
        self,
        client: EmbeddingClient | None,
        model: str,
        dimensions: int | None,
        expect_dimensions: int | None = None,
        paid: PaidRequests | None = None,
    ) -> None:
        self.client = client
        self.paid = paid  # where each successful request's vectors are kept at once
        self.last_batch = False  # its requests' vectors are published next: held, not written
        self.model = model
        self.dimensions = dimensions
        # the run's vector length: given by the flow, else learned from the first answer
        self.expected = expect_dimensions if expect_dimensions is not None else dimensions
        self.caps: RequestLimits | None = None if client is None else client.caps
        self.vectors: dict[int, np.ndarray] = {}
        self.dead_letters: list[DeadLetter] = []
        self.accepted: list[tuple[int, int]] = []  # (inputs, estimated tokens) per request
        self.lone_rejections: list[tuple[int | None, str]] = []  # while nothing was accepted
        self.tokens = 0
        self.tokens_estimated = 0  # approximate_tokens of the texts of answers with usage
        self.tokens_bound = 0  # estimate_tokens of the same texts
        self.requests = 0

    def keys(self, batch: Sequence[Row]) -> list[str]:
        return [row_key(r.id, r.text_sha256, self.model, self.dimensions) for r in batch]

    def embed(self, batch: list[Row]) -> None:
        """Embed ``batch``, isolating rejected rows; raises what cannot be isolated."""
        error = self._try(batch)
        if isinstance(error, RowError):
            self._isolate_rejected(batch, error)
        elif error is not None:
            self._isolate_server_error(batch, error)

    def _try(self, batch: list[Row]) -> RowError | RetryableError | None:
        """Send once (the client retries); return a rejection or a 500 that outlived its
        retries, record the vectors of a success, raise anything else."""
        if tasks_must_stop():
            raise StopRequestedError("the run is stopping; chunk released for the next run")
        keys = self.keys(batch)
        client = self.client
        assert client is not None  # a chunk with requests to send has a client
        try:
            result = client.embed(
                [r.text for r in batch],
                idempotency_key=request_key(keys),
                expect_dimensions=self.expected,
            )
        except EmbedlineError as exc:
            self.requests += exc.requests
            if isinstance(exc, RowError):
                return exc
            if (
                isinstance(exc, RetryableError)
                and exc.http_status == 500
                and not isinstance(exc, RetryLaterError)
            ):
                return exc
            raise
        self.tokens += result.tokens
        bound = sum(estimate_tokens(r.text) for r in batch)
        if result.tokens:  # the server reported usage: calibrates the estimates
            self.tokens_estimated += sum(approximate_tokens(r.text) for r in batch)
            self.tokens_bound += bound
        self.requests += result.requests
        if self.expected is None and len(result.vectors):
            self.expected = int(result.vectors.shape[1])  # later requests must agree
        self.accepted.append((len(batch), bound))
        if self.paid is not None:  # paid for: kept before anything else can fail the chunk
            self.paid.keep(
                keys,
                result.vectors,
                tokens=result.tokens,
                request_key=request_key(keys),
                text_hashes=[r.text_sha256 for r in batch],
                held=self.last_batch,
            )
        for row, vector in zip(batch, result.vectors, strict=True):
            self.vectors[row.row_number] = vector
        return None

    def _nothing_accepted(self) -> bool:
        """True until this chunk or (if the client says) any request of the run got a 2xx."""
        client = self.client
        assert client is not None  # a chunk with requests to send has a client
        return not self.accepted and client.accepted_requests == 0

    def _isolate_rejected(self, batch: list[Row], exc: RowError) -> None:
        if len(batch) == 1:
            self._reject_lone(batch[0], exc)
            return
        mark = (len(self.dead_letters), len(self.accepted))
        rest = self._probe_first_rows(batch) if self._nothing_accepted() else batch
        middle = len(rest) // 2
        for half in (rest[:middle], rest[middle:]):
            if half:
                self.embed(half)
        self._learn_cap(batch, exc, mark)

    def _probe_first_rows(self, batch: list[Row]) -> list[Row]:
        """Send the first rows alone (at most two) while nothing was accepted; return the
        rows still to embed. :raises RequestRejectedError: via ``_reject_lone``."""
        for i in range(min(2, len(batch))):
            error = self._try([batch[i]])
            if error is None:
                return batch[i + 1 :]
            if isinstance(error, RetryableError):
                raise error  # a 500 for a lone row whose batch got a 4xx: not isolable here
            self._reject_lone(batch[i], error)
            if not self._nothing_accepted():
                return batch[i + 1 :]
        return batch[2:]

    def _reject_lone(self, row: Row, exc: RowError) -> None:
        """Dead-letter a row rejected alone, unless it proves a request-level rejection."""
        if self._nothing_accepted():
            signature = (exc.http_status, exc.message)
            self.lone_rejections.append(signature)
            if self.lone_rejections.count(signature) >= 2:
                error = RequestRejectedError(
                    f"the server rejects every request, not one input (rows sent alone got "
                    f"the same answer as their batch): {exc.message}. Nothing was published "
                    "for this chunk; change the setting the server refuses (e.g. drop "
                    "--dimensions) and rerun",
                    http_status=exc.http_status,
                )
                stop = getattr(self.client, "stop", None)
                if stop is not None:
                    stop(error)  # no other chunk of this process sends the same request
                raise error
        self._dead(row, exc.reason, exc.http_status)

    def _learn_cap(self, batch: list[Row], exc: RowError, mark: tuple[int, int]) -> None:
        dead_before, accepted_before = mark
        worked = self.accepted[accepted_before:]
        if self.caps is None or len(self.dead_letters) != dead_before or not worked:
            return
        if not all(r.row_number in self.vectors for r in batch):
            return
        token_bound = "token" in exc.message.lower()
        self.caps.learn(
            rejected=len(batch),
            inputs=max(n for n, _ in worked),
            tokens=max(t for _, t in worked) if token_bound else None,
            status=exc.http_status,
        )

    def _isolate_server_error(self, batch: list[Row], exc: RetryableError) -> None:
        if len(batch) == 1:
            self._dead(batch[0], "server_error", exc.http_status)
            return
        middle = len(batch) // 2
        halves = (batch[:middle], batch[middle:])
        errors = [self._try(half) for half in halves]
        if all(isinstance(e, RetryableError) for e in errors):
            raise exc
        for half, error in zip(halves, errors, strict=True):
            if isinstance(error, RowError):
                self._isolate_rejected(half, error)
            elif error is not None:
                self._isolate_server_error(half, error)

    def _dead(self, row: Row, reason: str, http_status: int | None) -> None:
        self.dead_letters.append(DeadLetter(row.row_number, row.id, reason, http_status, 1))


def embed_rows(
    rows: Sequence[Row],
    client: EmbeddingClient | None,
    *,
    model: str,
    dimensions: int | None,
    batch_size: int,
    max_request_tokens: int,
    max_input_tokens: int | None = None,
    on_too_long: str = "dead-letter",
    expect_dimensions: int | None = None,
    paid: PaidRequests | None = None,
) -> EmbeddedRows:
    """Embed a chunk's ``rows``; return the embedded rows in input order and the dead letters.
    ``client`` is None when there is nothing to send (every row of the chunk reused).

    Empty or whitespace-only texts are never sent: they become ``empty_text`` dead letters
    (docs/reference/failure-classes.md). A batch answered with a row-permanent error (400/413/422)
    is bisected until the rejected rows are isolated; they become dead letters, the rest are
    embedded.

    Texts over ``max_input_tokens`` (None: no limit, e.g. the local model, which truncates
    itself): with ``on_too_long="dead-letter"`` a text whose *lenient* estimate
    (``ceil(chars / 4)``, OpenAI's rule of thumb for English) exceeds the limit is a
    ``too_long`` dead letter, never sent; shorter texts that the server still rejects (CJK
    runs about one token per character) are caught by the 400 bisection. With
    ``"truncate"``, every text was cut to ``3 × max_input_tokens`` UTF-8 bytes when it was read
    (``InputSource.truncate_bytes``, which fits in any script), so its keys and ``text_sha256``
    are of the text sent, and it is sent as is.

    Every vector has the run's length: ``expect_dimensions`` when given (the flow knows it
    from chunks published before), else ``dimensions``, else the first answer's length; an
    answer of another length is a bad response (retried once by the client,
    docs/reference/failure-classes.md).

    Every error raised carries the chunk's ``requests`` and ``tokens`` so far. With
    ``paid``, each successful request's vectors are kept there as soon as it answers
    (``tasks/embed/paid.py``), so a chunk that fails later does not pay for them again; those of
    the last batch are held in memory (``PaidRequests.keep_held_on_failure`` writes them if
    the chunk fails before it is published).

    :raises RequestRejectedError: the server refuses the request itself (see ``_Embedder``).
    :raises RetryableError: a request still failed after the client's attempt budget.
    :raises BadResponseError: an answer's vectors do not have the run's length.
    :raises FatalError: from the client (credentials, quota, model).
    """
    embedder = _Embedder(client, model, dimensions, expect_dimensions, paid)
    sendable = []
    for row in rows:
        if not row.text.strip():
            embedder.dead_letters.append(DeadLetter(row.row_number, row.id, "empty_text"))
        elif max_input_tokens is None or on_too_long == "truncate":  # truncate: cut when read
            sendable.append(row)
        elif math.ceil(len(row.text) / 4) > max_input_tokens:
            embedder.dead_letters.append(DeadLetter(row.row_number, row.id, "too_long"))
        else:
            sendable.append(row)
    if sendable and client is not None and client.whole_chunk:
        # an in-process model sorts the whole chunk by length itself: request batches would
        # only add padding and per-call overhead
        batch_size, max_request_tokens = (
            len(sendable),
            sum(estimate_tokens(r.text) for r in sendable),
        )
    try:
        done = 0
        for batch in batches(
            sendable,
            batch_size=batch_size,
            max_request_tokens=max_request_tokens,
            caps=embedder.caps,
        ):
            done += len(batch)
            embedder.last_batch = done == len(sendable)
            embedder.embed(batch)
    except EmbedlineError as exc:
        exc.requests, exc.tokens = embedder.requests, embedder.tokens  # the chunk's whole cost
        raise
    kept = [r for r in rows if r.row_number in embedder.vectors]
    vectors = _stack([embedder.vectors[r.row_number] for r in kept], dimensions)
    return EmbeddedRows(
        rows=kept,
        vectors=vectors,
        row_keys=embedder.keys(kept),
        dead_letters=sorted(embedder.dead_letters, key=lambda d: d.row_number),
        tokens=embedder.tokens,
        requests=embedder.requests,
        tokens_estimated=embedder.tokens_estimated,
        tokens_bound=embedder.tokens_bound,
    )


def merged(first: EmbeddedRows, second: EmbeddedRows) -> EmbeddedRows:
    """Both results as one (rows of ``first``, then ``second``; ``combine`` restores input
    order). :raises BadResponseError: their vectors differ in length."""
    if not second.rows:
        return dataclasses.replace(
            first,
            dead_letters=first.dead_letters + second.dead_letters,
            tokens=first.tokens + second.tokens,
            requests=first.requests + second.requests,
            tokens_estimated=first.tokens_estimated + second.tokens_estimated,
            tokens_bound=first.tokens_bound + second.tokens_bound,
        )
    return EmbeddedRows(
        rows=first.rows + second.rows,
        vectors=_stack([*first.vectors, *second.vectors], None),
        row_keys=first.row_keys + second.row_keys,
        dead_letters=sorted(first.dead_letters + second.dead_letters, key=lambda d: d.row_number),
        tokens=first.tokens + second.tokens,
        requests=first.requests + second.requests,
        tokens_estimated=first.tokens_estimated + second.tokens_estimated,
        tokens_bound=first.tokens_bound + second.tokens_bound,
    )


def _stack(vectors: list[np.ndarray], dimensions: int | None) -> np.ndarray:
    if not vectors:
        return np.zeros((0, dimensions or 0), dtype=np.float32)
    lengths = {len(v) for v in vectors}
    if len(lengths) != 1:
        raise BadResponseError(f"batches returned vectors of different lengths {sorted(lengths)}")
    return np.ascontiguousarray(np.stack(vectors), dtype=np.float32)
