"""What an interrupt is and how the command exits on one: the signals the command handles,
``Terminated`` (SIGTERM raised like ``KeyboardInterrupt``), recognizing an interrupt (also one
Python wrapped in another exception) and its exit code. No handler is installed here: the
handlers are ``flows.interrupt_handlers``' and ``flows.signals``'."""

from __future__ import annotations

import signal

__all__ = [
    "SIGNALS",
    "Terminated",
    "exit_code_for",
    "interrupt_of",
    "is_interrupt",
    "is_interrupt_exit",
    "signal_of",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM outside the flow's dispatch window (where ``flows.signals`` handles it), raised
    in the main thread like ``KeyboardInterrupt`` for SIGINT, so cleanups run and the CLI
    prints one line and exits 143. A ``BaseException``: ``except Exception`` never eats it."""

    signum = signal.SIGTERM


def signal_of(exc: BaseException) -> int:
    """The signal number behind an interrupt (``is_interrupt``): SIGTERM for ``Terminated``
    and Prefect's ``TerminationSignal`` (its ``signal``), SIGINT otherwise."""
    return int(getattr(exc, "signum", None) or getattr(exc, "signal", None) or signal.SIGINT)


def is_interrupt(exc: BaseException) -> bool:
    """True for an interrupt: ``KeyboardInterrupt`` (Ctrl-C), ``Terminated`` (SIGTERM) and
    Prefect 3.9's ``TerminationSignal`` (its SIGTERM handler while a flow run is open;
    matched by name, so this module imports no Prefect)."""
    return (
        isinstance(exc, KeyboardInterrupt | Terminated) or type(exc).__name__ == "TerminationSignal"
    )


def interrupt_of(exc: BaseException) -> BaseException | None:
    """``exc`` if it is an interrupt (``is_interrupt``), else the first interrupt among the
    exceptions it was raised from (``__cause__``, as ``raise … from``), else None. Python
    wraps some exceptions that end a hook it calls: a Ctrl-C that lands in a class body's
    ``__set_name__`` during an import (pyarrow imports pandas lazily, at its first array)
    surfaces as ``RuntimeError: Error calling __set_name__ …`` from the KeyboardInterrupt;
    the CLI says the interrupt's one line for it, not the traceback."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if is_interrupt(current):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


def exit_code_for(signum: int) -> int:
    """Shell convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


def is_interrupt_exit(code: int) -> bool:
    """Whether exit code ``code`` is that of a stop by one of ``SIGNALS`` (130, 143): a
    command's last line then says what stopped it, not an error of its own."""
    return code in (exit_code_for(s) for s in SIGNALS)
