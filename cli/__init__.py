"""The ``embedline`` command line (docs/reference/cli.md, a contract): an entry point above
``flows/``.

One module per command group: ``run`` (run, retry-failed), ``inspect`` (status,
dead-letters). Prefect and the adapters are imported inside the commands, so ``--help`` and
usage errors answer at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cli.started import STARTED_AT, interrupted_line

if TYPE_CHECKING:
    from signal import _HANDLER as _Handler

__all__ = ["STARTED_AT", "entry", "forget_caught_interrupts", "interrupted_line", "main"]

#: True once ``entry`` runs: ``main`` then leaves ``interrupt_handlers.raise_interrupt`` installed
#: for SIGINT/SIGTERM after the command (``cli.main`` restores only what it installed), so
#: no moment between the command's end and ``_exit_at_once`` has Python's SIGTERM default,
#: under which a SIGTERM sent as ``search`` prints its results kills the process (-15).
_entered = False

#: The exit code ``entry`` ends the process with once the exit handlers ran (None: let
#: Python finalize as usual, e.g. after a usage error or an unexpected exception).
_exit_code: int | None = None


def entry() -> None:
    """The ``embedline`` console script and ``python -m cli``: ``main()``, then exit.

    Once the command returned its code (its cleanups done: the temporary server stopped,
    the ledger written), the process ends as soon as Python's exit handlers ran (Prefect's
    among them), skipping the interpreter's teardown of every imported module: 0.7 s of
    each command, in which a Ctrl-C would kill the process by signal (status -2, or a
    "threading" traceback) instead of exit 130. A SIGINT/SIGTERM after ``main()`` returned
    ends the process at once with 130/143.
    """
    import atexit

    global _entered, _exit_code
    atexit.register(_end_process)  # registered first, so it runs after every other handler
    _entered = True
    try:
        code = main()
    except BaseException as exc:  # an interrupt after the command's own handling ended
        from embedline import interrupts

        interrupt = interrupts.interrupt_of(exc)
        if interrupt is None:
            raise
        code = interrupts.exit_code_for(interrupts.signal_of(interrupt))
    _exit_code = int(code)
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _exit_at_once)
    _skip_prefect_exit_sending()
    sys.exit(code)


def _skip_prefect_exit_sending() -> None:
    """With the temporary server stopped, end the process before Prefect's log and event
    workers try, at interpreter exit, to send what is left in their queues to it: they
    would retry for seconds (up to a minute) after a Ctrl-C that lands while they are
    being flushed. ``threading._register_atexit`` callbacks run last-registered first, and
    before ``atexit``'s, so this one runs before Prefect's. A configured server keeps them:
    it is still there to receive the run's last logs."""
    prefect_env = sys.modules.get("cli.prefect_env")
    register = getattr(threading, "_register_atexit", None)
    if prefect_env is None or register is None or not prefect_env.temporary_server_stopped():
        return
    with contextlib.suppress(RuntimeError):  # the interpreter already shuts its threads down
        register(_end_process)


def _end_process() -> None:
    if _exit_code is None:
        return
    cleanups = sys.modules.get("embedline.exit_cleanups")
    if cleanups is not None:  # embedline's own atexit work (scratch, ledger): os._exit skips it
        cleanups.run_exit_cleanups()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing to say
            stream.flush()
    os._exit(_exit_code)


def _exit_at_once(signum: int, frame: object) -> None:
    """The command has finished: a signal during exit handlers ends it now (no line)."""
    global _exit_code
    _exit_code = 128 + signum
    _end_process()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embedline`` console script and ``python -m cli``: see
    ``cli.main.main``. A Ctrl-C or SIGTERM while the command's modules load (about 0.2 s,
    nothing started yet) prints the same one line as later, not an import traceback."""
    early = _exit_quietly_on_signals()
    after = dict(early)  # the handlers once the command's modules are loaded
    try:
        if _entered:  # first: the command's modules import pyarrow (adapters/memory.py)
            from adapters.memory import keep_memory_flat

            keep_memory_flat()
        from cli.main import main as run
        from flows.interrupt_handlers import raise_interrupt

        if _entered:
            after = dict.fromkeys(early, raise_interrupt)
    finally:
        for signum, handler in after.items():
            signal.signal(signum, handler)
    try:
        return run(argv)
    finally:  # an interrupt still propagating sets the flag again as it leaves `-m`
        forget_caught_interrupts()


def forget_caught_interrupts() -> None:
    """Make the exit code we return the process's exit status, even after a Ctrl-C.

    CPython (since 3.8; seen on 3.11) sets a process-wide "unhandled KeyboardInterrupt"
    flag whenever a ``KeyboardInterrupt`` leaves a string ``exec``/``eval``
    (``run_eval_code_obj``), even if a caller catches it. ``dataclasses`` and
    ``namedtuple`` build their methods that way, so a Ctrl-C during a lazy import can land
    in one. Under ``python -m cli``,
    ``Py_RunMain`` checks the flag after our ``sys.exit(130)`` and kills the process with
    SIGINT instead (status -2; the console script's path does not check it). Every string
    ``exec`` clears the flag as it starts, so an empty one forgets the caught interrupt.
    """
    exec("", {})  # noqa: S102 (a constant empty string: see above)


def _exit_quietly_on_signals() -> dict[int, _Handler]:
    """Install ``_exit_quietly`` for SIGINT/SIGTERM where the default handlers (or
    ``entry``'s) are in place (an inherited SIG_IGN is kept); return the handlers it
    replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    # `interrupt_handlers` is not imported for this: it imports pydantic (0.2 s), which is
    # what the quiet handlers are for
    ours = getattr(sys.modules.get("flows.interrupt_handlers"), "raise_interrupt", None)
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    return {
        signum: signal.signal(signum, _exit_quietly)
        for signum, default in defaults.items()
        if signal.getsignal(signum) in (default, ours)
    }


def _exit_quietly(signum: int, frame: object) -> None:
    sys.stderr.write(interrupted_line(signum))
    os._exit(128 + signum)
