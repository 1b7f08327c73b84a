"""The command's SIGINT/SIGTERM handler outside the dispatch window, and the steps of a run
that put it in place or defer it; all read and write the process's stop state (``STOP``,
``embedline.shutdown``).

- ``raise_interrupt``: the handler ``cli.command_signals`` installs for the command. The first
  signal raises ``KeyboardInterrupt``/``Terminated`` so the cleanups run; while finishing it
  is held instead; a second one exits at once (``exit_on_second_signal``).
- ``interrupts_deferred``: a step that must not be cut in two (``import prefect``) notes the
  first signal and raises it when it ends; ``committing``: the same over a run's commit, in
  ``Phase.COMMITTING``.
- ``take_over_sigterm``, ``only_reporting_left``: in a flow the CLI runs in its own process,
  SIGTERM gets the command's handler back from Prefect's, and once the run is committed the
  first signal is held.

While chunks are in flight, ``flows.signals`` handles the signals instead. Here, not in the
core: installing handlers is the business of the layers that own the process (the CLI and the
flow it runs); the core keeps the state they share.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

from embedline.interrupts import SIGNALS, exit_code_for
from embedline.shutdown import STOP, Phase, StopState
from flows.hard_exit import hard_exit

__all__ = [
    "committing",
    "exit_on_second_signal",
    "interrupts_deferred",
    "only_reporting_left",
    "raise_interrupt",
    "take_over_sigterm",
]


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def raise_interrupt(signum: int, frame: object) -> None:
    """The command's SIGINT/SIGTERM handler outside the dispatch window (where
    ``flows.signals`` handles them). The first signal raises ``KeyboardInterrupt`` (SIGINT)
    or ``Terminated`` (SIGTERM) in the main thread, so the cleanups run: the temporary
    server stops, a started run is marked ``interrupted``. Those take seconds; a second
    signal while they run exits at once (``exit_on_second_signal``), as Prefect's CLI
    and pip do for a second Ctrl-C.

    In ``Phase.FINISHING`` the first signal is held instead: ``STOP.raise_held_interrupt``
    raises it once the flow run has ended.

    :raises KeyboardInterrupt: for the first SIGINT.
    :raises Terminated: for the first SIGTERM.
    """
    if STOP.interrupt_taken():
        exit_on_second_signal(signum)
    STOP.hold_or_raise(signum)


def exit_on_second_signal(signum: int, state: StopState = STOP) -> NoReturn:
    """Say so in one line and ``hard_exit`` with 128 + ``signum`` (its hooks stop the
    temporary server and mark the run ``interrupted``)."""
    todo = "rerun the same command to resume"
    committed = state.report.committed()
    if committed is not None:
        todo = f"run {committed.run_key[:12]} is committed: {committed.todo}"
    sys.stderr.write(f"embedline: second {signal.Signals(signum).name}, exiting now; {todo}\n")
    hard_exit(exit_code_for(signum), state.exit)


@contextlib.contextmanager
def interrupts_deferred(state: StopState = STOP) -> Iterator[None]:
    """SIGINT and SIGTERM are noted, not raised, inside the block, and the first one is
    raised when it ends (``KeyboardInterrupt`` or ``Terminated``); a second one exits at
    once (``exit_on_second_signal``). For ``import prefect``: an interrupt raised inside
    it is lost (pydantic wraps it in a ``RuntimeError`` while building a model class,
    which Prefect 3.9's plugin loader catches and logs) and the run would go on. For a
    run's commit: ``committing``. A no-op outside the main thread."""
    if not _main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: object) -> None:
        if noted or state.interrupt_raised():
            exit_on_second_signal(signum, state)
        noted.append(signum)

    previous = {
        s: signal.signal(s, note) for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        finishing = state.phase is Phase.FINISHING
        for signum, handler in previous.items():
            signal.signal(signum, raise_interrupt if finishing else handler)
    if noted:
        state.hold_or_raise(noted[0])


@contextlib.contextmanager
def committing(state: StopState = STOP) -> Iterator[None]:
    """``Phase.COMMITTING`` for the block (``STOP.commit_phase``), with interrupts deferred
    (``interrupts_deferred``): the manifest's PUT and the ledger's record of it happen
    together. Afterwards ``Phase.FINISHING`` if ``only_reporting_left`` was called in the
    block, else the phase before it (a sink's load or the flow's stop handling)."""
    with state.commit_phase(), interrupts_deferred(state):
        yield


def take_over_sigterm(state: StopState = STOP) -> None:
    """In a flow run by the CLI: put ``raise_interrupt`` back for SIGTERM in place of the
    handler Prefect 3.9 installs for the flow run (``capture_sigterm``, which raises
    ``TerminationSignal``), so SIGTERM is handled as SIGINT is: the first raises
    ``Terminated`` (Prefect records the flow run Crashed, the run is marked
    ``interrupted``), a second one while those cleanups run exits at once
    (``exit_on_second_signal``) instead of being raised inside those cleanups, which would
    leave the ledger's run ``running``. Prefect restores the command's handler when the
    flow run ends. A no-op unless ``STOP.command_handles_signals``; main thread only."""
    if not state.run_by_command() or not _main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, raise_interrupt)


def only_reporting_left(state: StopState = STOP) -> None:
    """The flow's run is committed (and loaded, if a sink was asked): what is left is
    reporting it, and Prefect recording the flow run's final state. A signal from now on
    stops nothing; raised, it would make Prefect mark the committed run's flow run
    Crashed.
    With ``STOP.command_handles_signals``: ``Phase.FINISHING``, ``raise_interrupt``
    installed (in place of Prefect's SIGTERM handler too), and the first signal held. Main
    thread only; else (and in a Prefect worker's process) a no-op."""
    if not state.run_by_command() or not _main_thread():
        return
    state.enter_finishing()
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, raise_interrupt)
