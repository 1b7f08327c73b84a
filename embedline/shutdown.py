"""A process-wide stop flag: set on SIGINT/SIGTERM, read by chunk tasks between batches.

Chunk tasks run in worker threads that signals cannot interrupt; they check
``stop_requested()`` before each request and raise ``StopRequestedError`` so their chunk is
released for the next run instead of being cut off half-way.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["exit_code_for", "request_stop", "reset", "stop_requested", "stop_signal"]

_stop = threading.Event()
_signal: int | None = None


def request_stop(signum: int) -> None:
    """Ask every chunk task of this process to stop; ``signum`` is the signal received."""
    global _signal
    _signal = signum
    _stop.set()


def stop_requested() -> bool:
    """True once a stop was requested."""
    return _stop.is_set()


def stop_signal() -> int | None:
    """The signal that requested the stop, if any."""
    return _signal


def exit_code_for(signum: int) -> int:
    """Shell convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


def reset() -> None:
    """Clear the flag (start of a run in a long-lived process)."""
    global _signal
    _signal = None
    _stop.clear()


SIGNALS = (signal.SIGINT, signal.SIGTERM)
