"""The fatal latch and circuit breaker of one embedding client: once a fatal answer (or an
endpoint that refuses every connection) is seen, the client sends nothing more, from any
thread, and every later call raises an equivalent error at once (docs/reference/failure-classes.md,
"fatal").
"""

from __future__ import annotations

import threading

import httpx

from adapters.embeddings.common import Logger
from embedline.errors import EmbedlineError, EndpointDownError, FatalError, RetryableError

__all__ = ["FatalLatch"]


class FatalLatch:
    """The first ``FatalError`` or ``EndpointDownError`` of a client, kept for good.

    Thread-safe. ``nap`` is a sleep that ends early once the latch is set, so calls waiting
    for a pacer, a pause or a backoff wake up and raise. ``note_answer`` records that the
    server answered some request (any status): the circuit breaker (``unreachable``) then
    reads refused connections as an outage rather than a wrong ``--base-url``.
    """

    def __init__(self, logger: Logger) -> None:
        self._logger = logger
        self._stopped = threading.Event()
        self._error: FatalError | EndpointDownError | None = None
        self._lock = threading.Lock()
        self._answered = False

    @property
    def fatal_error(self) -> FatalError | None:
        """The latched fatal answer, or None (also while the breaker is open)."""
        error = self._error if self._stopped.is_set() else None
        return error if isinstance(error, FatalError) else None

    @property
    def endpoint_down(self) -> EndpointDownError | None:
        """The outage that opened the circuit breaker, or None."""
        error = self._error if self._stopped.is_set() else None
        return error if isinstance(error, EndpointDownError) else None

    def note_answer(self) -> None:
        """The server answered a request (of any status)."""
        self._answered = True

    def stop(self, error: FatalError | EndpointDownError) -> None:
        """Latch the first fatal answer or outage (later ones are ignored), logged once."""
        with self._lock:
            if self._error is not None:
                return
            self._error = error
            self._stopped.set()
        if isinstance(error, EndpointDownError):
            what = "the endpoint is down"
        elif error.http_status is None:  # no answer: an unreachable endpoint, a store error
            what = f"fatal error ({type(error).__name__})"
        else:
            what = f"fatal answer ({type(error).__name__}, status {error.http_status})"
        self._logger.warning("%s: this client sends no more requests", what)

    def check(self) -> None:
        """Raise the latched error again (same class family and message, so whichever
        chunk reports first, the run's summary reads the same), without sending.

        :raises FatalError: once a fatal answer stopped the client.
        :raises EndpointDownError: once the circuit breaker opened.
        """
        if not self._stopped.is_set():
            return
        first = self._error
        assert first is not None  # set before the event
        if isinstance(first, EndpointDownError):
            raise EndpointDownError(first.message)
        raise FatalError(first.message, http_status=first.http_status)

    def nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the latch is set meanwhile."""
        self._stopped.wait(seconds)

    def unreachable(
        self, exc: EmbedlineError, *, where: str, max_attempts: int
    ) -> FatalError | EndpointDownError | None:
        """The error that opens the circuit breaker for a call that ended with ``exc``, or
        None if it should not open.

        It opens for a call that used up its ``max_attempts`` on refused connections
        (``httpx.ConnectError``; a timeout may be a slow server): the endpoint is wrong or
        down, not flaky, so the client stops instead of letting every chunk spend its own
        retries on it. If no request of this client was ever answered, it is a wrong
        ``--base-url`` or a server that is not running: ``FatalError`` (exit 3). If earlier
        requests were answered, the server went down mid-run: ``EndpointDownError`` (exit
        1, a rerun resumes what was not published). ``where`` names the endpoint without
        credentials. The caller latches the result with ``stop``.
        """
        cause = exc.__cause__
        if (
            not isinstance(exc, RetryableError)
            or isinstance(exc, EndpointDownError)
            or not isinstance(cause, httpx.ConnectError)
        ):
            return None
        attempts = f"{max_attempts} attempt" + ("" if max_attempts == 1 else "s")
        where = f"{where} ({type(cause).__name__}, {attempts})"
        if not self._answered:
            return FatalError(
                f"cannot connect to {where} and no request of this run ever reached it: "
                "check that the server is running and --base-url is right, then rerun"
            )
        return EndpointDownError(
            f"the embedding server stopped accepting connections: cannot connect to {where} "
            f"after it answered earlier requests; rerun the same command once it is back"
        )
