"""The client for any OpenAI-compatible ``POST {base_url}/embeddings`` (OpenAI, Azure-style
gateways, vLLM, TEI, Ollama, LM Studio, infinity, LiteLLM), over httpx.

One ``embed`` call is: wait for the shared pause and the RPM/TPM pacer
(``adapters.rate_limit``), take a concurrency slot, send once, classify the answer
(``classify``), decode it (``decode``), retried under ``embedline.retry``. The small objects
it is made of each keep one piece of state shared by every thread of the process:
``SharedPause`` (a 429's wait), ``RequestCaps`` (learned request sizes), ``FatalLatch`` (the
fatal latch and circuit breaker) and ``FormatNegotiation`` (base64 or float). Nothing here
logs or raises with input text, vectors, the API key or the ``Idempotency-Key`` value.

Rule sources: OpenAI embeddings API reference
(https://platform.openai.com/docs/api-reference/embeddings) for the request/response shape,
``encoding_format``, ``dimensions`` and ``usage``; OpenAI rate-limits guide
(https://platform.openai.com/docs/guides/rate-limits) for RPM/TPM.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from adapters.embeddings.caps import RequestCaps, estimate_tokens
from adapters.embeddings.classify import NEVER_SENT, classify, classify_transport_error
from adapters.embeddings.common import HTTP_LOGGER, Logger
from adapters.embeddings.decode import json_or_none, parse_embeddings, usage_tokens, well_formed
from adapters.embeddings.encoding import FormatNegotiation
from adapters.embeddings.endpoint import (
    auth_headers,
    auth_hint,
    check_api_key,
    check_header_name,
    endpoint_url,
    new_http_client,
    safe_url,
)
from adapters.embeddings.latch import FatalLatch
from adapters.embeddings.pause import SharedPause, defer_if_too_long
from adapters.embeddings.spend import SpendCap
from adapters.rate_limit import Pacer, RequestPacer
from embedline.errors import (
    CostCapError,
    EmbedlineError,
    EndpointDownError,
    FatalError,
    RateLimitedError,
    RetryableError,
)
from embedline.protocols import Embeddings
from embedline.retry import MAX_RETRY_AFTER_S, request_retrying

if TYPE_CHECKING:
    from tenacity import RetryCallState

__all__ = ["OpenAIEmbedder"]


@dataclass(slots=True)
class _Call:
    """Book-keeping of one ``embed`` call: HTTP requests sent, own pause deadline, the
    batch's estimated tokens (``estimate_tokens`` summed, for the TPM pacer)."""

    estimated_tokens: int
    expect_dimensions: int | None = None  # the run's vector length, when the caller knows it
    requests: int = 0
    inputs: int = 0  # texts in the requests sent (a retry sends them again)
    pause_deadline: float = 0.0
    before_send: Callable[[], None] | None = None  # the caller's fence, before each attempt


class OpenAIEmbedder:
    """Client for an OpenAI-compatible ``POST {base_url}/embeddings`` endpoint.

    Thread-safe; one instance is meant to be shared by every task of a process
    (``build_embedder``), so its limits hold for the whole process:

    - at most ``concurrency`` HTTP requests are in flight at once (a semaphore held only
      while a request is on the wire and its answer is classified, never while waiting for
      the pacer, a pause or a backoff);
    - ``rpm``/``tpm`` pace request starts evenly (``adapters.rate_limit.RequestPacer``, or
      the ``pacer`` given, which holds them beyond this process);
      each attempt books one request and the batch's ``estimate_tokens``, corrected with
      the answer's ``usage`` (a failed answer keeps the estimate). A booked start is the
      earliest one: a request that then waits for a slot goes later, so when every slot
      is busy, waiting requests go out as slots free up (never more than ``concurrency``);
    - a 429 with a server-given wait pauses every request of this client until then;
    - a server wait above ``max_wait_s`` is not slept: that call raises ``RetryLaterError``
      at once (and, for a 429, so does every call of this client while the pause lasts);
    - fatal latch: after the first ``FatalError`` answer, every ``embed`` call, from any
      thread, raises an equivalent ``FatalError`` without sending; calls waiting for the
      pacer, a pause or a backoff wake at once (with the default ``sleep``) and raise too.
      Only requests already holding a slot may still reach the server: at most
      ``concurrency - 1`` after the fatal answer;
    - circuit breaker: a call that spends all ``max_attempts`` on refused connections
      (``httpx.ConnectError``) latches like a fatal answer. Before this client ever got
      an HTTP answer it latches a ``FatalError`` ("no request of this run ever reached it":
      a wrong ``--base-url``, a server not running; exit 3); after one, an
      ``EndpointDownError`` (the server went down mid-run; exit 1, a rerun resumes). Either
      way the run stops after one call's retries (about 8 s with the default backoff), not
      after every chunk's. Timeouts and dropped
      connections never open it: a slow server is not a down one.

    :param base_url: e.g. ``https://api.openai.com/v1``; a query string (Azure-style
        ``?api-version=``) is kept after ``/embeddings``.
    :param dimensions: sent as ``dimensions`` when set, and every vector must have it.
    :param api_key: sent as ``Authorization: Bearer KEY``, or as ``NAME: KEY`` when
        ``auth_header`` names another header (Azure-style gateways read ``api-key``); None
        sends no key at all.
    :param auth_header: the header that carries the key (an RFC 9110 field name).
    :param encoding_format: ``"base64"`` or ``"float"`` for every request; ``"auto"`` asks
        for base64 and, until the server has accepted a base64 request, answers a rejection
        or a server error by resending that request once as ``"float"``: if that works (or
        the answer named ``encoding_format``), float is used for the rest of the run,
        logged once. Some servers refuse base64 with a 400, a FastAPI 422 or a 500.
    :param timeout_s: per-request connect/read/write/pool timeout, seconds.
    :param max_attempts: HTTP attempts per ``embed`` call, the first one included.
    :param concurrency: HTTP requests in flight at once, across threads.
    :param rpm: requests per minute, None for no limit.
    :param tpm: tokens per minute, None for no limit.
    :param pacer: the pacer that holds ``rpm``/``tpm``, when they are a budget shared beyond
        this process (a Dask cluster's: ``tasks.embed.cluster_budget``); default a
        ``RequestPacer`` of this client's own.
    :param max_wait_s: longest server wait (``retry-after-ms``/``Retry-After``) slept inside
        a call, seconds; default ``embedline.retry.MAX_RETRY_AFTER_S`` (120 s).
    :param spend: ``--max-cost``: each request is booked against it as it is about to be
        sent and settled with the answer's ``usage``; a refusal (``CostCapError``) latches
        like a fatal answer (``adapters.embeddings.spend``).
    :param client: an ``httpx.Client`` to use (tests pass one with ``MockTransport``);
        not closed by ``close()``.
    :param sleep: called with seconds for backoff, pauses and pacing (tests record it);
        default: a sleep that ends early once the client is stopped by a fatal answer.
    :param clock: monotonic seconds for the pacer and pauses (default ``time.monotonic``).
    :raises InputError: if ``base_url`` is not an http(s) URL.
    :raises ValueError: if ``rpm`` or ``tpm`` is below 1.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        dimensions: int | None,
        api_key: str | None,
        timeout_s: float,
        max_attempts: int,
        concurrency: int = 8,
        rpm: int | None = None,
        tpm: int | None = None,
        pacer: Pacer | None = None,
        max_wait_s: float = MAX_RETRY_AFTER_S,
        auth_header: str = "Authorization",
        encoding_format: str = "auto",
        spend: SpendCap | None = None,
        client: httpx.Client | None = None,
        logger: Logger | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = endpoint_url(base_url)
        check_api_key(api_key)
        check_header_name(auth_header)
        self._logger: Logger = logger or logging.getLogger(HTTP_LOGGER)
        self._format = FormatNegotiation(encoding_format, logger=self._logger)
        self.base_url = base_url
        self.model = model
        self.dimensions = dimensions
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.concurrency = concurrency
        self.max_wait_s = max_wait_s
        self._api_key = api_key or None
        self._auth_header = auth_header
        self._owns_client = client is None
        self._client = client if client is not None else new_http_client(timeout_s, concurrency)
        self._latch = FatalLatch(self._logger)
        self._sleep: Callable[[float], None] = sleep if sleep is not None else self._latch.nap
        self._slots = threading.BoundedSemaphore(concurrency)
        self._pause = SharedPause(clock)
        self._pacer: Pacer = pacer or RequestPacer(rpm=rpm, tpm=tpm, clock=clock)
        self.caps = RequestCaps(logger=self._logger)
        self.spend = spend

    whole_chunk = False  # request batches: the chunk logic sizes them

    def __repr__(self) -> str:
        key = "'[secure]'" if self._api_key else "None"
        return (
            f"OpenAIEmbedder(base_url={safe_url(self.base_url)!r}, model={self.model!r}, "
            f"dimensions={self.dimensions!r}, api_key={key}, rpm={self.rpm!r}, "
            f"tpm={self.tpm!r})"
        )

    @property
    def rpm(self) -> int | None:
        """Requests per minute this client paces to, or None."""
        return self._pacer.rpm

    @property
    def tpm(self) -> int | None:
        """Tokens per minute this client paces to, or None."""
        return self._pacer.tpm

    @property
    def encoding_format(self) -> str:
        """``"base64"``, or ``"float"`` once the server has refused base64."""
        return self._format.current

    @property
    def accepted_requests(self) -> int:
        """Requests this client got a well-formed 2xx answer to."""
        return self._format.accepted_requests

    @property
    def fatal_error(self) -> FatalError | None:
        """The first fatal answer, once the client has stopped sending; else None (also
        while the circuit breaker is open: ``endpoint_down``)."""
        return self._latch.fatal_error

    @property
    def endpoint_down(self) -> EndpointDownError | None:
        """The outage that opened the circuit breaker, once the client stopped; else None."""
        return self._latch.endpoint_down

    def embed(
        self,
        texts: Sequence[str],
        *,
        idempotency_key: str,
        expect_dimensions: int | None = None,
        before_send: Callable[[], None] | None = None,
    ) -> Embeddings:
        """Embed ``texts`` in one request, retried; return float32 ``(len(texts), d)``.

        ``d`` is ``dimensions`` when set, else ``expect_dimensions`` when given (the run's
        length, learned from its first answer: an answer of another length is a bad
        response). Every attempt carries the same ``Idempotency-Key``. ``tokens`` is the server's
        ``usage`` (0 if absent); ``requests`` counts HTTP requests sent, retries included
        (a connection that never opened is not one).

        ``before_send`` is called once a request holds its concurrency slot, right before
        it goes out: every attempt, after every wait (a chunk lease's fence: a copy cut off
        from the network through its retries, whose chunk another copy took meanwhile,
        sends no retry when the network returns). What it raises ends the call at once,
        not retried, carrying the ``requests`` and ``inputs`` sent before.

        :raises ValueError: if ``texts`` is empty (callers never send an empty batch).
        :raises RowError: 400/413/422: the batch holds an input the server rejects.
        :raises RetryLaterError: the server asked to wait more than ``max_wait_s`` seconds
            (``retry_after_s`` holds its wait); nothing more is sent for this call.
        :raises RetryableError: still failing after ``max_attempts`` attempts
            (``RateLimitedError`` for 429).
        :raises BadResponseError: the last answer had a wrong count, index, length or
            non-finite values.
        :raises FatalError: 401/403, 404, ``insufficient_quota``, other 4xx; also at once,
            without sending, once any earlier call of this client got one.
        Rule source: https://platform.openai.com/docs/api-reference/embeddings/create
        (``input`` array of at most 2048 strings, ``data[].index``, ``usage``).
        """
        if not texts:
            raise ValueError("embed() needs at least one text")
        self._latch.check()
        batch = list(texts)
        call = _Call(
            estimated_tokens=sum(estimate_tokens(t) for t in batch),
            expect_dimensions=expect_dimensions,
            before_send=before_send,
        )
        retrying = request_retrying(
            max_attempts=self.max_attempts,
            max_wait_s=self.max_wait_s,
            sleep=self._sleep,
            before_sleep=self._log_retry,
        )
        try:
            for attempt in retrying:
                with attempt:
                    try:
                        vectors, tokens = self._post_once(batch, idempotency_key, call)
                    except RetryableError as exc:
                        if isinstance(exc, RateLimitedError):
                            call.pause_deadline = self._pause.extend(
                                exc.retry_after_s, http_status=exc.http_status
                            )
                        defer_if_too_long(exc, max_wait_s=self.max_wait_s, logger=self._logger)
                        raise
        except EmbedlineError as exc:
            exc.requests, exc.inputs = call.requests, call.inputs  # what this call paid for
            unreachable = self._latch.unreachable(
                exc, where=safe_url(self.base_url), max_attempts=self.max_attempts
            )
            if unreachable is not None:
                unreachable.requests, unreachable.inputs = call.requests, call.inputs
                self._latch.stop(unreachable)
                raise unreachable from None
            raise
        return Embeddings(
            vectors=vectors, tokens=tokens, requests=call.requests, inputs=call.inputs
        )

    def stop(self, error: FatalError) -> None:
        """Latch ``error`` as if the server had answered it: nothing more is sent."""
        self._latch.stop(error)

    def close(self) -> None:
        """Close the HTTP connections, unless the ``httpx.Client`` was injected."""
        if self._owns_client:
            self._client.close()

    # -- one attempt ---------------------------------------------------------------------

    def _admit(self, call: _Call) -> None:
        """Wait, holding no concurrency slot, until this client may send one request.

        Sleeps through the shared 429 pause, then books the request with the pacer and
        sleeps until its start; repeats if a new pause began meanwhile. Checks the fatal
        latch after every wait.

        :raises FatalError: the client was stopped by a fatal answer.
        :raises RetryLaterError: the shared pause has more than ``max_wait_s`` to run.
        """
        while True:
            self._latch.check()
            call.pause_deadline = self._pause.wait(
                self._sleep, covered=call.pause_deadline, max_wait_s=self.max_wait_s
            )
            self._latch.check()
            delay = self._pacer.reserve(call.estimated_tokens)
            if delay > 0:
                self._sleep(delay)
                self._latch.check()
            if not self._pause.pending(covered=call.pause_deadline):
                return

    def _post_once(self, texts: list[str], key: str, call: _Call) -> tuple[np.ndarray, int]:
        """One paced round trip and its classification; returns (vectors, tokens).

        The answer is classified while the concurrency slot is held, so a fatal answer
        stops the client before another request can take the slot. A base64 request that
        may have failed because of base64 is resent once as float (``_try_float``).
        """
        response, payload, error, fmt = self._round_trip(texts, key, None, call)
        step = self._format.after_failure(fmt, error, payload, status=response.status_code)
        if step == "resend":
            return self._post_once(texts, key, call)
        if step == "probe_float":
            result = self._try_float(texts, key, call, response.status_code)
            if result is not None:
                return result
        if isinstance(error, FatalError):
            self._latch.stop(error)
        if error is not None:
            raise error
        return self._accepted_answer(payload, texts, call, fmt)

    def _round_trip(
        self, texts: list[str], key: str, fmt: str | None, call: _Call
    ) -> tuple[httpx.Response, object, EmbedlineError | None, str]:
        """Admit, send once holding a slot, classify; returns (response, JSON, error, format
        sent). ``fmt`` None sends the client's format as of the moment the slot is taken. A
        fatal answer (but one the format probe may explain) latches the client before the
        slot is released."""
        self._admit(call)
        with self._slots:
            self._latch.check()
            if call.before_send is not None:
                call.before_send()
            fmt = fmt or self._format.current
            self._book(call)
            try:
                response, payload = self._send(texts, key, fmt, call)
            except BaseException:
                self._settle(call, None)
                raise
            error = classify(
                response.status_code,
                response.headers,
                payload,
                model=self.model,
                path=self._url.path,
                redact=texts,
                auth_hint=auth_hint(self._api_key, self._auth_header),
            )
            self._settle(call, None if error is not None else usage_tokens(payload))
            if isinstance(error, FatalError) and not self._format.may_explain(fmt, error, payload):
                self._latch.stop(error)
        return response, payload, error, fmt

    def _book(self, call: _Call) -> None:
        """Book the request about to be sent against ``spend`` (``--max-cost``).

        :raises CostCapError: it would pass the cap: latched, nothing more is sent.
        """
        if self.spend is None:
            return
        try:
            self.spend.book(call.estimated_tokens)
        except CostCapError as exc:
            self._latch.stop(exc)
            raise

    def _settle(self, call: _Call, reported_tokens: int | None) -> None:
        """Settle the booked request (``SpendCap.settle``): None for a failed answer."""
        if self.spend is not None:
            self.spend.settle(call.estimated_tokens, reported_tokens)

    def _try_float(
        self, texts: list[str], key: str, call: _Call, status: int
    ) -> tuple[np.ndarray, int] | None:
        """Resend a failed base64 request once as float; on success use float from now on
        and return its result, else keep base64 for good and return None."""
        _, payload, error, _ = self._round_trip(texts, key, "float", call)
        if error is not None or not well_formed(payload, len(texts)):
            self._format.probe_failed()
            return None
        self._format.use_float(status)
        return self._accepted_answer(payload, texts, call, "float")

    def _accepted_answer(
        self, payload: object, texts: list[str], call: _Call, fmt: str
    ) -> tuple[np.ndarray, int]:
        length = self.dimensions if self.dimensions is not None else call.expect_dimensions
        vectors, tokens = parse_embeddings(payload, len(texts), length, redact=texts)
        self._format.accepted(fmt)
        if tokens:
            self._pacer.correct(estimated=call.estimated_tokens, used=tokens)
        return vectors, tokens

    def _send(
        self, texts: list[str], key: str, fmt: str, call: _Call
    ) -> tuple[httpx.Response, object]:
        """POST once (the caller holds a concurrency slot); returns (response, decoded JSON)."""
        body: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": fmt}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        headers = {
            "Idempotency-Key": key,
            "Accept": "application/json",
            **auth_headers(self._api_key, self._auth_header),
        }
        call.requests += 1
        call.inputs += len(texts)
        started = time.perf_counter()
        try:
            response = self._client.post(
                self._url, json=body, headers=headers, timeout=self.timeout_s
            )
        except httpx.RequestError as exc:
            self._log_call(type(exc).__name__, len(texts), call.requests, started)
            if isinstance(exc, NEVER_SENT):
                call.requests -= 1  # no byte reached a server: nothing to count or pay for
                call.inputs -= len(texts)
            error = classify_transport_error(exc, where=safe_url(self.base_url))
            if isinstance(error, FatalError):
                self._latch.stop(error)
            # a LocalProtocolError's text can quote a header value: do not chain it
            cause = None if isinstance(exc, httpx.LocalProtocolError) else exc
            raise error from cause
        self._latch.note_answer()
        self._log_call(response.status_code, len(texts), call.requests, started)
        return response, json_or_none(response)

    # -- logging -------------------------------------------------------------------------

    def _log_call(self, status: object, n: int, attempt: int, started: float) -> None:
        elapsed_ms = (time.perf_counter() - started) * 1000
        self._logger.info(
            "POST %s -> %s (%d inputs, attempt %d, %.0f ms)",
            self._url.path,
            status,
            n,
            attempt,
            elapsed_ms,
        )

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        self._logger.warning(
            "embedding request retry in %.2f s after %s (status %s; attempt %d of %d): %s",
            state.upcoming_sleep,
            type(exc).__name__,
            getattr(exc, "http_status", None),
            state.attempt_number,
            self.max_attempts,
            exc,
        )
