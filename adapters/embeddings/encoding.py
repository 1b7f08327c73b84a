"""The base64 ↔ float negotiation of ``encoding_format`` with one server.

``"auto"`` asks for base64 (a quarter of the bytes of JSON floats) and, until the server
has accepted a base64 request, reads a rejection or a server error as a possible refusal
of base64: the request is resent once as float, and if that works (or the error named
``encoding_format``) float is used for the rest of the run. Some servers refuse base64
with a 400, a FastAPI 422 or a 500. ``"base64"`` and ``"float"`` are used as given.

Rule source: OpenAI embeddings API reference, ``encoding_format``
(https://platform.openai.com/docs/api-reference/embeddings/create).
"""

from __future__ import annotations

import threading
from typing import Literal

from adapters.embeddings.classify import error_object
from adapters.embeddings.common import Logger
from embedline.errors import EmbedlineError, FatalError, RateLimitedError, RetryableError, RowError

__all__ = ["FormatNegotiation", "Next"]

#: What to do after a failed request: send it again in the format now in use, resend it
#: once as float to see whether base64 was the cause, or raise the error as it is.
Next = Literal["resend", "probe_float", "raise"]

_SETTINGS = ("auto", "base64", "float")


class FormatNegotiation:
    """The ``encoding_format`` one client sends, and what it learned about it; thread-safe.

    ``current`` is the format to send; ``settled`` once it is known to work (a base64 answer
    accepted, a float probe decided) or was set by the user. ``accepted_requests`` counts
    the well-formed 2xx answers that ``accepted`` was told of.

    :raises ValueError: if ``setting`` is not ``"auto"``, ``"base64"`` or ``"float"``.
    """

    def __init__(self, setting: str, *, logger: Logger) -> None:
        if setting not in _SETTINGS:
            raise ValueError(f"encoding_format must be auto, base64 or float: {setting!r}")
        self._logger = logger
        self._lock = threading.Lock()
        self._format = "float" if setting == "float" else "base64"
        self._settled = setting != "auto"
        self._accepted = 0

    @property
    def current(self) -> str:
        """``"base64"``, or ``"float"`` once the server has refused base64 (or by setting)."""
        return self._format

    @property
    def accepted_requests(self) -> int:
        """Well-formed 2xx answers so far, in either format."""
        return self._accepted

    def may_explain(self, fmt: str, error: EmbedlineError | None, payload: object) -> bool:
        """True if base64 may be why a request sent as ``fmt`` failed with ``error`` (its
        decoded body ``payload``): then a fatal answer must not latch the client yet."""
        return (
            fmt == "base64"
            and not self._settled
            and _probe_worthy(error)
            and not _names_another_param(payload)
        )

    def after_failure(
        self, fmt: str, error: EmbedlineError | None, payload: object, *, status: int
    ) -> Next:
        """Decide what follows a request sent as ``fmt`` that failed with ``error``.

        ``"resend"`` if another call switched to float meanwhile, or the error names
        ``encoding_format`` (float from now on, logged once); ``"probe_float"`` if base64
        may be the cause (``may_explain``); else ``"raise"``. ``status`` is the answer's
        HTTP status, for the log line.
        """
        if fmt != "base64" or error is None:
            return "raise"
        if self._format == "float":
            return "resend"  # another call found float meanwhile
        if self._settled:
            return "raise"
        if _mentions_encoding_format(payload):
            self.use_float(status)
            return "resend"
        return "probe_float" if self.may_explain(fmt, error, payload) else "raise"

    def probe_failed(self) -> None:
        """The float probe failed alike: base64 was not the cause, keep it for good."""
        with self._lock:
            self._settled = True

    def use_float(self, status: int) -> None:
        """Send float for the rest of the run (the server refused base64 with ``status``);
        logged once."""
        with self._lock:
            first = self._format == "base64"
            self._format, self._settled = "float", True
        if first:
            self._logger.warning(
                "the server refused encoding_format=base64 (HTTP %s) and accepted float: "
                "using float for the rest of the run",
                status,
            )

    def accepted(self, fmt: str) -> None:
        """A request sent as ``fmt`` got a well-formed answer: count it; base64 works."""
        with self._lock:
            self._accepted += 1
            if fmt == "base64":
                self._settled = True


def _mentions_encoding_format(payload: object) -> bool:
    error = error_object(payload)
    return any("encoding_format" in str(error.get(k) or "") for k in ("message", "param"))


def _names_another_param(payload: object) -> bool:
    """True when the error body blames a request field other than ``encoding_format``."""
    param = error_object(payload).get("param")
    return bool(param) and "encoding_format" not in str(param)


def _probe_worthy(error: EmbedlineError | None) -> bool:
    """Could this answer to a base64 request be the server refusing base64? A rejection or
    a server error is; auth, model, quota and rate-limit answers are not."""
    status = getattr(error, "http_status", None)  # not every embedline error has one
    if isinstance(error, RowError):
        return True
    if isinstance(error, RetryableError) and not isinstance(error, RateLimitedError):
        return status in (500, 501)  # not 502-504: those say "overloaded", not "cannot do"
    return (
        isinstance(error, FatalError)
        and status is not None
        and 400 <= status < 500
        and (status not in (401, 403, 404, 429))
    )
