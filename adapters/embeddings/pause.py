"""Waiting for the server: one client-wide pause after a 429 that named a wait, and the rule
that a wait above ``max_wait_s`` is never slept inside a task (``RetryLaterError``).

Rule source: RFC 9110 §10.2.3 ``Retry-After``, and OpenAI's ``retry-after-ms`` (parsed in
``embedline.retry``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from adapters.embeddings.common import Logger
from embedline.errors import RetryableError, RetryLaterError

__all__ = ["SharedPause", "defer_if_too_long"]


class SharedPause:
    """A ``clock()`` deadline before which no request of one client is sent (a 429's wait).

    Thread-safe. Each call remembers the deadline it already slept through (``covered``), so
    a call that slept its own 429's wait does not sleep the same pause again.
    """

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

    def wait(self, sleep: Callable[[float], None], *, covered: float, max_wait_s: float) -> float:
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
                http_status=status,
                retry_after_s=remaining,
            )
        sleep(remaining)
        return until

    def pending(self, *, covered: float) -> bool:
        """True if a pause not yet slept through (later than ``covered``) is still running."""
        with self._lock:
            until = self._until
        return until > covered and until > self._clock()


def defer_if_too_long(exc: RetryableError, *, max_wait_s: float, logger: Logger) -> None:
    """Let a retryable answer be retried, unless the server's wait is too long to sleep.

    :raises RetryLaterError: if ``exc.retry_after_s`` (seconds, RFC 9110 §10.2.3
        ``Retry-After``) exceeds ``max_wait_s``; the call ends at once instead of sleeping in
        a task. A ``RetryLaterError`` or an answer without a wait is left as it is.
    """
    wait = exc.retry_after_s
    if isinstance(exc, RetryLaterError) or wait is None or wait <= max_wait_s:
        return
    logger.warning(
        "server asked to wait %.0f s (status %s), above the %.0f s a task sleeps: batch deferred",
        wait,
        exc.http_status,
        max_wait_s,
    )
    raise RetryLaterError(
        f"HTTP {exc.http_status}: the server asked to retry in {wait:.0f} s, above the "
        f"{max_wait_s:.0f} s limit; the batch is deferred, rerun later",
        http_status=exc.http_status,
        retry_after_s=wait,
    ) from exc
