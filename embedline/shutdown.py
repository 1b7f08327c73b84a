"""Process-wide stop state for SIGINT/SIGTERM, shared by the flow and its chunk tasks.

First signal: ``note_signal`` — the run submits no new chunks; in-flight chunks keep going.
When the grace period runs out, ``stop_tasks`` — chunk tasks (worker threads, which signals
cannot interrupt) check ``tasks_must_stop()`` before each request and raise
``StopRequestedError``, so their chunk is released for the next run. Second signal:
``hard_exit`` — run the registered hooks (e.g. stop Prefect's temporary server) and exit.

Outside the dispatch window (planning, Prefect's start, the commit), ``raise_interrupt`` is
the command's handler: the first signal raises ``KeyboardInterrupt``/``Terminated`` so the
cleanups run, a second one exits at once; ``interrupts_deferred`` holds the first back over
a step that must not be cut in two (the manifest's PUT and the ledger's record of it). Once
a CLI run has nothing left but reporting (``note_finishing``: committed, and loaded if a
sink was asked), the first signal is held until the flow run has ended (Completed in the
Prefect UI, not Crashed) and the CLI raises it (``raise_held_interrupt``). In a flow the CLI
runs, SIGTERM keeps that handler too (``take_over_sigterm``), not Prefect's.

The Prefect API going away mid-run (the CLI's watchdog: a configured server that stops
answering, or the temporary server's process exiting) is a stop of the same kind:
``note_api_lost`` — the dispatcher submits no new chunks and gives in-flight ones the grace
period; the flow records the outcome in the ledger and ``hand_over``s its summary to the
waiting CLI thread (``wait_for_hand_over``), which prints it and exits without waiting for
Prefect's client, whose retries of each call take about a minute (2+4+8+16+32 s).

A cancel from Prefect (the UI's Cancel) of a flow run the CLI runs is a SIGTERM that
``flows.cancellation`` sends this process after ``note_prefect_cancel``: it stops the run
as a SIGTERM does, and ``stop_cause`` names it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SIGNALS",
    "ApiLoss",
    "Terminated",
    "api_lost",
    "command_handles_signals",
    "committed",
    "exit_code_for",
    "exit_on_second_signal",
    "expect_hand_over",
    "forget_interrupts",
    "hand_over",
    "hard_exit",
    "install_interrupt_handlers",
    "interrupts_deferred",
    "is_interrupt",
    "note_api_lost",
    "note_committed",
    "note_finishing",
    "note_signal",
    "note_termination",
    "on_first_interrupt",
    "on_hard_exit",
    "note_prefect_cancel",
    "pending_termination",
    "prefect_cancel_requested",
    "raise_held_interrupt",
    "raise_interrupt",
    "redeliver_lost_interrupts",
    "remove_hard_exit_hook",
    "reset",
    "run_by_command",
    "run_hard_exit_hooks",
    "signal_of",
    "stop_cause",
    "stop_signal",
    "stop_tasks",
    "take_over_sigterm",
    "tasks_must_stop",
    "wait_for_hand_over",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_tasks_stop = threading.Event()
_signal: int | None = None
_hard_exit_hooks: list[Callable[[], None]] = []


class Terminated(BaseException):
    """SIGTERM outside the flow's dispatch window (where ``flows.signals`` handles it), raised
    in the main thread like ``KeyboardInterrupt`` for SIGINT, so cleanups run and the CLI
    prints one line and exits 143. A ``BaseException``: ``except Exception`` never eats it."""

    signum = signal.SIGTERM


#: The signal whose interrupt ``raise_interrupt`` (or ``interrupts_deferred``) raised and
#: the command is unwinding from; None before the first.
_raised: int | None = None


def raise_interrupt(signum: int, frame: object) -> None:
    """The command's SIGINT/SIGTERM handler outside the dispatch window (where
    ``flows.signals`` handles them). The first signal raises ``KeyboardInterrupt`` (SIGINT)
    or ``Terminated`` (SIGTERM) in the main thread, so the cleanups run: the temporary
    server stops, a started run is marked ``interrupted``. Those take seconds; a second
    signal while they run exits at once (``exit_on_second_signal``), as Prefect's CLI and
    pip do for a second Ctrl-C.

    While the run is finishing (``note_finishing``), the first signal is held instead:
    ``raise_held_interrupt`` raises it once the flow run has ended.

    :raises KeyboardInterrupt: for the first SIGINT.
    :raises Terminated: for the first SIGTERM.
    """
    if _raised is not None or _held is not None:
        exit_on_second_signal(signum)
    _hold_or_raise(signum)


def install_interrupt_handlers() -> dict[int, Any]:
    """Install ``raise_interrupt`` for SIGINT and SIGTERM where Python's defaults are in
    place (main thread only); return the handlers it replaced, to restore. An inherited
    SIG_IGN (a supervisor, ``nohup``) is kept, and so is any handler already installed."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    return {signum: signal.signal(signum, raise_interrupt)
            for signum, default in defaults.items() if signal.getsignal(signum) == default}


#: Called (main thread, no arguments) as the first interrupt is raised: see
#: ``on_first_interrupt``.
_first_interrupt_hooks: list[Callable[[], None]] = []


def on_first_interrupt(hook: Callable[[], None]) -> None:
    """Register ``hook`` (once) to run as ``raise_interrupt`` raises the first interrupt,
    before any cleanup: e.g. silence a library whose teardown, cut short, logs errors the
    command's one line already covers. It must be quick and never raise."""
    if hook not in _first_interrupt_hooks:
        _first_interrupt_hooks.append(hook)


def _raise_first(signum: int) -> None:
    global _raised
    _raised = signum
    for hook in list(_first_interrupt_hooks):
        hook()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated("the process received SIGTERM")  # Prefect's crash message quotes it


def exit_on_second_signal(signum: int) -> None:
    """Say so in one line and ``hard_exit`` with 128 + ``signum`` (its hooks stop the
    temporary server and mark the run ``interrupted``). Never returns."""
    todo = "rerun the same command to resume"
    if _committed is not None:
        todo = f"run {_committed[0][:12]} is committed: {_committed[2]}"
    sys.stderr.write(f"embedline: second {signal.Signals(signum).name}, exiting now; {todo}\n")
    hard_exit(exit_code_for(signum))


def forget_interrupts() -> None:
    """Forget an interrupt ``raise_interrupt`` raised (a new command in this process, or one
    that Python lost and ``redeliver_lost_interrupts`` sends again)."""
    global _raised
    _raised = None


def redeliver_lost_interrupts(unraisable: Any) -> bool:
    """For ``sys.unraisablehook``: an interrupt raised where Python cannot propagate it (a
    ``__del__``, a weakref callback such as importlib's module-lock ``cb``) is printed as
    "Exception ignored in …" and lost, and the command went on as if no Ctrl-C had come
    (about 1 Ctrl-C in 500 in the first 50 ms of planning). Send its signal to the main
    thread again ``_REDELIVER_AFTER_S`` seconds later, from a timer thread (sent from here,
    it would be raised inside this hook and lost again), so the handler raises it at a
    point that can propagate it. Returns True if ``unraisable`` was an interrupt (print
    nothing for it), False otherwise."""
    exc = unraisable.exc_value
    if exc is None or not is_interrupt(exc):
        return False
    forget_interrupts()  # the one redelivered is a first signal, not a second
    main = threading.main_thread().ident
    timer = threading.Timer(_REDELIVER_AFTER_S, signal.pthread_kill, (main, signal_of(exc)))
    timer.daemon = True
    timer.start()
    return True


#: Seconds before a lost interrupt's signal is sent again: long enough for the callback
#: that lost it to return, short enough to feel immediate.
_REDELIVER_AFTER_S = 0.01


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM are noted, not raised, inside the block, and the first one is
    raised when it ends (``KeyboardInterrupt`` or ``Terminated``); a second one exits at
    once (``exit_on_second_signal``). For ``import prefect``: an interrupt raised inside it
    was lost (pydantic wraps it in a ``RuntimeError`` while building a model class, which
    Prefect 3.9's plugin loader catches and logs) and the run went on. For a run's commit:
    the manifest's PUT and the ledger's record of it happen together. A no-op outside the
    main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: object) -> None:
        if noted or _raised is not None:
            exit_on_second_signal(signum)
        noted.append(signum)

    previous = {s: signal.signal(s, note)
                for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}  # fmt: skip
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, raise_interrupt if _finishing else handler)
    if noted:
        _hold_or_raise(noted[0])


def _hold_or_raise(signum: int) -> None:
    """The first signal: held while finishing, else raised."""
    global _held
    if _finishing:
        _held = _held or signum
    else:
        _raise_first(signum)


def signal_of(exc: BaseException) -> int:
    """The signal number behind an interrupt (``is_interrupt``): SIGTERM for ``Terminated``
    and Prefect's ``TerminationSignal`` (its ``signal``), SIGINT otherwise."""
    return int(getattr(exc, "signum", None) or getattr(exc, "signal", None) or signal.SIGINT)


def is_interrupt(exc: BaseException) -> bool:
    """True for an interrupt: ``KeyboardInterrupt`` (Ctrl-C), ``Terminated`` (SIGTERM) and
    Prefect 3.9's ``TerminationSignal`` (its SIGTERM handler while a flow run is open;
    matched by name, so this module imports no Prefect)."""
    return isinstance(exc, KeyboardInterrupt | Terminated) or \
        type(exc).__name__ == "TerminationSignal"  # fmt: skip


@dataclass(frozen=True, slots=True)
class ApiLoss:
    """Why the run stops: ``what`` happened, and ``todo`` for the user (one line each part)."""

    what: str
    todo: str


_api_loss: ApiLoss | None = None
_dispatching = threading.Event()
_handed_over = threading.Event()
_summary: dict[str, Any] | None = None


def note_signal(signum: int) -> None:
    """Record that the run is stopping because of ``signum``."""
    global _signal
    _signal = signum


def note_termination(exc: BaseException) -> None:
    """Keep Prefect's ``TerminationSignal`` that started a graceful stop in a flow run under a
    Prefect runner, for the flow to raise again once the run is recorded (the first one
    only)."""
    global _termination
    if _termination is None:
        _termination = exc


def pending_termination() -> BaseException | None:
    """The ``TerminationSignal`` ``note_termination`` kept, if any."""
    return _termination


_termination: BaseException | None = None


def stop_signal() -> int | None:
    """The signal that is stopping the run, if any."""
    return _signal


#: Prefect cancelled the flow run this command runs (``flows.cancellation``): the SIGTERM
#: it sends this process is reported as a cancel.
_prefect_cancel = False


def note_prefect_cancel() -> bool:
    """Record that Prefect cancelled the flow run this command runs in its own process,
    before ``flows.cancellation`` sends this process the SIGTERM that stops it. Returns
    False, recording nothing, when the command is already stopping on a signal (noted,
    raised or held): a SIGTERM then would count as a second signal and exit at once."""
    global _prefect_cancel
    if _signal is not None or _raised is not None or _held is not None:
        return False
    _prefect_cancel = True
    return True


def prefect_cancel_requested() -> bool:
    """True once ``note_prefect_cancel`` recorded a cancel (until the next command)."""
    return _prefect_cancel


def stop_cause(signum: int) -> str:
    """What stopped the command, as its summary and last line say it: "cancelled from
    Prefect" for the SIGTERM of a cancel, else "interrupted by SIGINT" (or SIGTERM)."""
    if _prefect_cancel and signum == signal.SIGTERM:
        return "cancelled from Prefect"
    return f"interrupted by {signal.Signals(signum).name}"


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


def remove_hard_exit_hook(hook: Callable[[], None]) -> None:
    """Unregister ``hook`` (no-op if it is not registered)."""
    if hook in _hard_exit_hooks:
        _hard_exit_hooks.remove(hook)


def run_hard_exit_hooks() -> None:
    """Run the registered hooks (best effort): also when an interrupt ends the command
    before a run's own stop handling took over."""
    for hook in list(_hard_exit_hooks):
        try:
            hook()
        except OSError:
            pass


def hard_exit(code: int) -> None:
    """Run the hooks (best effort), flush, and end the process now with ``code``."""
    run_hard_exit_hooks()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def reset() -> None:
    """Clear the stop state (start of a run in a long-lived process)."""
    global _signal, _termination
    _signal = None
    _termination = None
    _tasks_stop.clear()


#: (run key, manifest URI, what is left to do) of the run this command committed.
_committed: tuple[str, str, str] | None = None
#: The committed run's summary (``RunSummary.to_dict()``), once nothing is left but reporting.
_committed_summary: dict[str, Any] | None = None


def note_committed(run_key: str | None, manifest_uri: str = "", todo: str = "",
                   summary: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Record that this command committed run ``run_key`` (its manifest and the ledger's
    record of it are written; ``todo``: what a rerun would still do, e.g. load a sink), so
    an interrupt from now on is not reported as work to redo; None forgets it, and the
    finishing state (a new command). ``summary``: the run's summary, given once nothing is
    left to do but report it (``committed_summary``)."""
    global _committed, _committed_summary, _finishing, _held, _command_handles_signals
    global _prefect_cancel
    _committed = None if run_key is None else (run_key, manifest_uri, todo)
    _committed_summary = None if run_key is None else summary
    if run_key is None:
        _finishing = _command_handles_signals = _prefect_cancel = False
        _held = None


#: The command (the CLI) runs the flow in its own process and handles the signals itself.
_command_handles_signals = False
#: The run has nothing left to do but report (``note_finishing``).
_finishing = False
#: The signal held while finishing, for ``raise_held_interrupt``.
_held: int | None = None


def command_handles_signals() -> None:
    """Called by the CLI before it runs a flow in its own process. The flow then keeps the
    command's handler for SIGTERM as for SIGINT (``take_over_sigterm``), and holds the first
    signal once the run is finishing (``note_finishing``). Never called in a Prefect
    worker's process, where SIGTERM is the runner's way to cancel and keeps Prefect's
    handler."""
    global _command_handles_signals
    _command_handles_signals = True


def run_by_command() -> bool:
    """True in the CLI's own process (``command_handles_signals``); False in a process that a
    Prefect worker, ``serve`` or the user's own code started for the flow run."""
    return _command_handles_signals


def take_over_sigterm() -> None:
    """In a flow run by the CLI: put ``raise_interrupt`` back for SIGTERM in place of the
    handler Prefect 3.9 installs for the flow run (``capture_sigterm``, which raises
    ``TerminationSignal``), so SIGTERM is handled as SIGINT is: the first raises
    ``Terminated`` (Prefect records the flow run Crashed, the run is marked
    ``interrupted``), a second one while those cleanups run exits at once
    (``exit_on_second_signal``). Under Prefect's handler the second was raised inside the
    cleanups: the ledger's run stayed ``running``. Prefect restores the command's handler
    when the flow run ends. A no-op unless ``command_handles_signals``; main thread only."""
    if not _command_handles_signals or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, raise_interrupt)


def note_finishing() -> None:
    """The flow's run is committed (and loaded, if a sink was asked): what is left is
    reporting it, and Prefect recording the flow run's final state. A signal from now on
    stopped nothing; raised, it made Prefect mark the committed run's flow run Crashed.
    With ``command_handles_signals``, install ``raise_interrupt`` (in place of Prefect's
    SIGTERM handler too) and hold the first signal. Main thread only; else a no-op."""
    global _finishing
    if not _command_handles_signals or threading.current_thread() is not threading.main_thread():
        return
    _finishing = True
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, raise_interrupt)


def raise_held_interrupt() -> None:
    """Stop holding; raise the interrupt of a signal held while finishing, if one came.

    :raises KeyboardInterrupt: a SIGINT was held.
    :raises Terminated: a SIGTERM was held.
    """
    global _finishing, _held
    held, _held, _finishing = _held, None, False
    if held is not None:
        _raise_first(held)


def committed() -> tuple[str, str, str] | None:
    """(run key, manifest URI, todo) of the run this command committed, if any."""
    return _committed


def committed_summary() -> dict[str, Any] | None:
    """The summary of the run this command committed, once only reporting is left: what
    the CLI prints if the Prefect API goes away while the flow reports it."""
    return _committed_summary


def note_api_lost(loss: ApiLoss) -> None:
    """Record that the Prefect API went away: the run stops dispatching (never cleared)."""
    global _api_loss
    _api_loss = loss


def api_lost() -> ApiLoss | None:
    """The loss of the Prefect API that is stopping the run, if any."""
    return _api_loss


def expect_hand_over() -> None:
    """The flow started dispatching: from now on it ends by ``hand_over`` if the API goes
    away (before, a CLI that lost the API has nothing to wait for and exits at once)."""
    _dispatching.set()


def hand_over(summary: dict[str, Any]) -> bool:
    """Give the run's summary to the CLI thread waiting after an API loss; True if one is
    waiting for it (the flow's return value will then not be read)."""
    global _summary
    if _api_loss is None:
        return False
    _summary = summary
    _handed_over.set()
    return True


def wait_for_hand_over(timeout_s: float) -> dict[str, Any] | None:
    """The summary the flow hands over, waiting at most ``timeout_s`` seconds while it is
    dispatching; None if it is not, or did not in time."""
    if not _dispatching.is_set() and not _handed_over.is_set():
        return None
    _handed_over.wait(timeout_s)
    return _summary
