"""The command's signal handling at its start: ``install_interrupt_handlers`` puts the
command's handler (``flows.interrupt_handlers.raise_interrupt``) in place for SIGINT and
SIGTERM, and ``redeliver_lost_interrupts`` sends again an interrupt Python could not
propagate. Both are ``cli.main``'s, which owns the command's process.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from embedline.interrupts import interrupt_of, signal_of
from embedline.shutdown import STOP
from flows.interrupt_handlers import raise_interrupt

__all__ = ["install_interrupt_handlers", "redeliver_lost_interrupts"]

#: Seconds between the end of the hook that caught a lost interrupt and its signal sent
#: again: long enough for the hook to return, short enough to feel immediate.
_REDELIVER_AFTER_S = 0.05


def install_interrupt_handlers() -> dict[int, Any]:
    """Install ``raise_interrupt`` for SIGINT and SIGTERM where Python's defaults are in
    place (main thread only); return the handlers it replaced, to restore. An inherited
    SIG_IGN (a supervisor, ``nohup``) is kept, and so is any handler already installed."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    return {
        signum: signal.signal(signum, raise_interrupt)
        for signum, default in defaults.items()
        if signal.getsignal(signum) == default
    }


def redeliver_lost_interrupts(unraisable: Any) -> bool:
    """For ``sys.unraisablehook``: an interrupt raised where Python cannot propagate it
    (a ``__del__``, a weakref callback such as importlib's module-lock ``cb``) is printed
    as "Exception ignored in …" and lost, and the command would go on as if no Ctrl-C
    had come (a Ctrl-C in the first 50 ms of planning can land there). Send its signal
    to the main thread again from a thread of its own (sent from here, it would be raised
    inside this hook and lost again), ``_REDELIVER_AFTER_S`` seconds after this hook has
    returned, so the handler raises it at a point that can propagate it. The thread
    waits for the hook to end, not just the delay: on a loaded machine starting it can
    take longer than the delay, and the signal would come back inside the hook
    ("Exception ignored in sys.unraisablehook"). Returns True if ``unraisable`` was an
    interrupt (print nothing for it), False otherwise."""
    exc = None if unraisable.exc_value is None else interrupt_of(unraisable.exc_value)
    if exc is None:
        return False
    STOP.forget_interrupts()  # the one redelivered is a first signal, not a second
    main, signum = threading.main_thread().ident, signal_of(exc)
    assert main is not None, "the main thread has started"
    hook_ended = threading.Event()

    def send() -> None:
        hook_ended.wait()
        time.sleep(_REDELIVER_AFTER_S)
        signal.pthread_kill(main, signum)

    try:
        threading.Thread(target=send, name="redeliver-interrupt", daemon=True).start()
    finally:
        hook_ended.set()
    return True
