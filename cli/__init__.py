"""The ``embedline`` command line (DESIGN §3, a contract): an entry point above ``flows/``.

One module per command group: ``run`` (run, retry-failed), ``inspect`` (status,
dead-letters). Prefect and the adapters are imported inside the commands, so ``--help`` and
usage errors answer at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

#: ``time.monotonic()`` when the command started (this package is its first import).
STARTED_AT = time.monotonic()

__all__ = ["STARTED_AT", "forget_caught_interrupts", "interrupted_line", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embedline`` console script and ``python -m cli``: see
    ``cli.main.main``. A Ctrl-C or SIGTERM while the command's modules load (about 0.2 s,
    nothing started yet) prints the same one line as later, not an import traceback."""
    early = _exit_quietly_on_signals()
    try:
        from cli.main import main as run
    finally:
        for signum, handler in early.items():
            signal.signal(signum, handler)
    try:
        return run(argv)
    finally:  # an interrupt still propagating sets the flag again as it leaves `-m`
        forget_caught_interrupts()


def forget_caught_interrupts() -> None:
    """Make the exit code we return the process's exit status, even after a Ctrl-C.

    CPython (since 3.8; seen on 3.11) sets a process-wide "unhandled KeyboardInterrupt" flag whenever a
    ``KeyboardInterrupt`` leaves a string ``exec``/``eval`` (``run_eval_code_obj``), even
    if a caller catches it. ``dataclasses`` and ``namedtuple`` build their methods that
    way, so a Ctrl-C during a lazy import can land in one. Under ``python -m cli``,
    ``Py_RunMain`` checks the flag after our ``sys.exit(130)`` and kills the process with
    SIGINT instead (status -2; the console script's path does not check it). Every string
    ``exec`` clears the flag as it starts, so an empty one forgets the caught interrupt.
    """
    exec("", {})  # noqa: S102 (a constant empty string: see above)


def _exit_quietly_on_signals() -> dict[int, object]:
    """Install ``_exit_quietly`` for SIGINT/SIGTERM where the default handlers are in place
    (an inherited SIG_IGN is kept); return the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    return {signum: signal.signal(signum, _exit_quietly) for signum, default in
            defaults.items() if signal.getsignal(signum) == default}  # fmt: skip


def interrupted_line(signum: int) -> str:
    """The one line an interrupted command ends with (here and in ``cli.main``)."""
    return (f"embedline: interrupted by {signal.Signals(signum).name}; rerun the same command "
            "to resume\n")


def _exit_quietly(signum: int, frame: object) -> None:
    sys.stderr.write(interrupted_line(signum))
    os._exit(128 + signum)
