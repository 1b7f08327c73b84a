"""HTTP failure classification for OpenAI-compatible servers (docs/reference/failure-classes.md):
every answer and every transport failure becomes one embedline error, most specific first.

Error bodies are read in the shapes of the server families seen in the field: OpenAI
(``{"error": {"code", "type", "message", "param"}}``), vLLM (``{"object": "error",
"message", ...}``), TEI and Ollama (``{"error": "...", "error_type": ...}``) and FastAPI
servers such as infinity and LiteLLM (``{"detail": ...}``). Messages never quote an input.

Rule sources: OpenAI error codes guide (https://platform.openai.com/docs/guides/error-codes)
for 401/403/429/``insufficient_quota``; RFC 9110 §10.2.3 for ``Retry-After`` (via
``embedline.retry``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from embedline.errors import (
    EmbedlineError,
    FatalError,
    RateLimitedError,
    RetryableError,
    RowError,
)
from embedline.retry import parse_retry_after

__all__ = [
    "NEVER_SENT",
    "classify",
    "classify_transport_error",
    "error_detail",
    "error_fields",
    "error_object",
]

_RETRYABLE_STATUSES = frozenset({408, 409, 425, 500, 502, 503, 504})
_ROW_STATUSES = frozenset({400, 413, 422})
_AUTH_STATUSES = frozenset({401, 403})
_DETAIL_CHARS = 200
_KEY_HINT = "set EMBEDLINE_API_KEY (or OPENAI_API_KEY) to a valid key for this endpoint"

#: Transport failures before any byte of the request left this process: a refused or
#: timed-out connect, or no free connection in the pool (httpx's exception hierarchy).
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


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
        return RetryableError(
            f"cannot connect to{at} ({name}): check that the server is "
            "running and --base-url is right"
        )
    if isinstance(exc, httpx.TimeoutException):
        return RetryableError(
            f"no answer from{at} in time ({name}); if the server is slow, "
            "raise --timeout or send smaller requests (--batch-size)"
        )
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
        return (
            None
            if payload is not None
            else RetryableError(f"HTTP {status} with a body that is not JSON", http_status=status)
        )
    code, message = error_fields(payload)
    detail = error_detail(code, message, redact)
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


def error_object(payload: object) -> Mapping[str, Any]:
    """The error mapping of an OpenAI (``{"error": {...}}``), vLLM, TEI or FastAPI error body;
    ``{}`` for anything else (a list, a string, None)."""
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
    error = error_object(payload)
    return {str(error[k]) for k in ("code", "type") if error.get(k) is not None}


def error_fields(payload: object) -> tuple[str | None, str]:
    """(code, message) of an error body: the code is ``code`` else ``type`` (None if
    neither), the message ``""`` when absent."""
    error = error_object(payload)
    code = error.get("code") or error.get("type")
    message = error.get("message")
    return (str(code) if code is not None else None, str(message) if message else "")


def error_detail(code: str | None, message: str, redact: Sequence[str]) -> str:
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
