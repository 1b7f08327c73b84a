"""Retry policy for HTTP requests: which errors to retry, how long to wait, when to stop.

Pure: no I/O (sleeping is injected). Built on tenacity (``Retrying``, ``stop_after_attempt``,
``wait_random_exponential``) so the adapter's retry loop is ``for attempt in policy:``.

- Retried: ``RetryableError`` (its subclass ``RateLimitedError`` included) and
  ``BadResponseError`` (docs/reference/failure-classes.md: a malformed 2xx is retried, then the
  chunk fails). A malformed 2xx is retried at most once (``MAX_BAD_RESPONSES``): a server that
  answers a request with a bad 200 usually answers it the same way again, and every attempt is
  billed. ``RowError`` and ``FatalError`` are never retried.
- Wait: the server's wait when the error carries one (``retry_after_s``, parsed from
  ``retry-after-ms`` / ``Retry-After``), else full-jitter exponential backoff
  (``uniform(0, min(cap, base * 2 ** (attempt - 1)))``, AWS Architecture Blog,
  "Exponential Backoff And Jitter").
- Server waits are honoured up to ``MAX_RETRY_AFTER_S`` (120 s), like openai-python
  ``_calculate_retry_timeout`` bounds what it honours. A longer wait is not slept inside a
  task: the adapter raises ``RetryLaterError`` (carrying the server's full wait) and this
  policy never retries it, so the chunk is released at once and the run reports it.
  ``parse_retry_after`` and ``WaitRetryAfter`` still clamp to ``max_wait_s`` by default, as a
  safety net for callers that do not make that check.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from tenacity import (
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from embedline.errors import BadResponseError, EndpointDownError, RetryableError, RetryLaterError

if TYPE_CHECKING:
    from tenacity import RetryCallState

__all__ = [
    "MAX_BAD_RESPONSES",
    "MAX_RETRY_AFTER_S",
    "WaitRetryAfter",
    "parse_retry_after",
    "request_retrying",
]

#: Malformed 2xx answers accepted for one request before it fails (the first try included).
MAX_BAD_RESPONSES = 2

#: Longest server-requested wait honoured, in seconds; longer waits are clamped to this.
MAX_RETRY_AFTER_S = 120.0

# RFC 9110 §10.2.3: delay-seconds = 1*DIGIT. A fractional part is accepted too (some
# gateways send "1.5"); signs, exponents, "nan" and "inf" are not.
_SECONDS = re.compile(r"[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*")


def parse_retry_after(
    headers: Mapping[str, str],
    *,
    now: float | None = None,
    max_wait_s: float = MAX_RETRY_AFTER_S,
) -> float | None:
    """Return the server's requested wait in seconds, or None when it gave none usable.

    Looks, with case-insensitive names, at ``retry-after-ms`` (milliseconds, may be
    fractional; an OpenAI/Azure extension) first, then ``Retry-After``, which is either
    delay-seconds or an HTTP-date (RFC 9110 §10.2.3; RFC 9110 §5.6.7 for the date forms).
    A date in the past gives 0.0. Waits above ``max_wait_s`` are clamped to it.
    Never raises: an unparseable value is treated as absent.

    :param now: the current time as a Unix timestamp (seconds), for HTTP-dates;
        defaults to ``time.time()``.
    """
    lowered = {str(name).lower(): value for name, value in headers.items()}
    wait = _parse_ms(lowered.get("retry-after-ms"))
    if wait is None:
        wait = _parse_retry_after_value(lowered.get("retry-after"), now=now)
    if wait is None:
        return None
    return min(wait, max_wait_s)


def _parse_ms(value: str | None) -> float | None:
    if value is None:
        return None
    match = _SECONDS.fullmatch(value)
    return float(match.group(1)) / 1000.0 if match else None


def _parse_retry_after_value(value: str | None, *, now: float | None) -> float | None:
    if value is None:
        return None
    match = _SECONDS.fullmatch(value)
    if match:
        return float(match.group(1))
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" zone: RFC 5322 says UTC with no local meaning
        when = when.replace(tzinfo=UTC)
    delta = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, delta) if math.isfinite(delta) else None


class WaitRetryAfter(wait_base):
    """Tenacity wait strategy: the server's wait if the failure carries one, else ``fallback``.

    Reads ``retry_after_s`` (seconds) from the last attempt's exception
    (``RetryableError``/``RateLimitedError``); shaped like tenacity's ``wait_exception``
    (``__call__(retry_state) -> float``, seconds). The server's wait is clamped to
    ``[0, max_wait_s]``.
    """

    def __init__(self, fallback: wait_base, *, max_wait_s: float = MAX_RETRY_AFTER_S) -> None:
        self.fallback = fallback
        self.max_wait_s = max_wait_s

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        server_wait = getattr(exc, "retry_after_s", None)
        if server_wait is None:
            return float(self.fallback(retry_state))
        return min(max(float(server_wait), 0.0), self.max_wait_s)


class _StopAfterBadResponses(stop_base):
    """Stop once ``limit`` attempts of one call ended in ``BadResponseError``.

    One instance per ``Retrying`` (one call): it counts the bad answers it was shown.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = 0

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        if outcome is not None and isinstance(outcome.exception(), BadResponseError):
            self.seen += 1
        return self.seen >= self.limit


def request_retrying(
    *,
    max_attempts: int,
    backoff_base_s: float = 0.5,
    backoff_cap_s: float = 20.0,
    max_wait_s: float = MAX_RETRY_AFTER_S,
    sleep: Callable[[float], None] = time.sleep,
    before_sleep: Callable[[RetryCallState], None] | None = None,
) -> Retrying:
    """Return the retry policy for one HTTP request.

    Retries ``RetryableError`` and ``BadResponseError`` only, never ``RetryLaterError`` (a
    server wait above ``max_wait_s`` seconds: the caller releases the work instead of
    sleeping) nor ``EndpointDownError`` (the client's circuit breaker is open); stops after
    ``max_attempts`` attempts, the first try included, or after
    ``MAX_BAD_RESPONSES`` malformed 2xx answers, whichever comes first; waits per
    ``WaitRetryAfter`` over full-jitter backoff (``backoff_base_s * 2 ** (attempt - 1)``
    seconds, at most ``backoff_cap_s``). ``reraise=True``: callers see the last embedline
    error, never ``tenacity.RetryError``.

    :param sleep: called with the wait in seconds (tests pass ``list.append``).
    :param before_sleep: called with the tenacity ``RetryCallState`` before each sleep
        (``retry_state.upcoming_sleep`` holds the seconds), e.g. to log a warning.
    :raises ValueError: if ``max_attempts`` < 1.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    fallback = wait_random_exponential(multiplier=backoff_base_s, max=backoff_cap_s)
    return Retrying(
        sleep=sleep,
        stop=stop_after_attempt(max_attempts) | _StopAfterBadResponses(MAX_BAD_RESPONSES),
        wait=WaitRetryAfter(fallback, max_wait_s=max_wait_s),
        retry=(
            retry_if_exception_type((RetryableError, BadResponseError))
            & retry_if_not_exception_type((RetryLaterError, EndpointDownError))
        ),
        before_sleep=before_sleep,
        reraise=True,
    )
