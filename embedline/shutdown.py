"""Process-wide stop state for SIGINT/SIGTERM, shared by the flow and its chunk tasks.

First signal: ``note_signal`` — the run submits no new chunks; in-flight chunks keep going.
When the grace period runs out, ``stop_tasks`` — chunk tasks (worker threads, which signals
cannot interrupt) check ``tasks_must_stop()`` before each request and raise
``StopRequestedError``, so their chunk is released for the next run. Second signal:
``hard_exit`` — run the registered hooks (e.g. stop Prefect's temporary server) and exit.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

__all__ = [
    "SIGNALS",
    "exit_code_for",
    "hard_exit",
    "note_signal",
    "on_hard_exit",
    "reset",
    "stop_signal",
    "stop_tasks",
    "tasks_must_stop",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_tasks_stop = threading.Event()
_signal: int | None = None
_hard_exit_hooks: list[Callable[[], None]] = []


def note_signal(signum: int) -> None:
    """Record that the run is stopping because of ``signum``."""
    global _signal
    _signal = signum


def stop_signal() -> int | None:
    """The signal that is stopping the run, if any."""
    return _signal


def stop_tasks() -> None:
    """Ask every chunk task of this process to stop before its next request."""
    _tasks_stop.set()


def tasks_must_stop() -> bool:
    """True once ``stop_tasks`` was called."""
    return _tasks_stop.is_set()


def exit_code_for(signum: int) -> int:
    """Shell convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


def on_hard_exit(hook: Callable[[], None]) -> None:
    """Register ``hook`` to run before ``hard_exit`` ends the process."""
    _hard_exit_hooks.append(hook)


def hard_exit(code: int) -> None:
    """Run the hooks (best effort), flush, and end the process now with ``code``."""
    for hook in _hard_exit_hooks:
        try:
            hook()
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def reset() -> None:
    """Clear the stop state (start of a run in a long-lived process)."""
    global _signal
    _signal = None
    _tasks_stop.clear()
