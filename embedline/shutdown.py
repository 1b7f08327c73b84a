"""Process-wide stop state for SIGINT/SIGTERM, shared by the command, the flow and its chunk
tasks: one ``StopState``, ``STOP``, whose ``Phase`` says who handles a signal now. Plain
state: the handlers that read and write it are installed by the layers that own the process
(``cli.command_signals`` for the command, ``flows.interrupt_handlers`` and ``flows.signals``
for what the flow takes over), and the process ends at once in ``flows.hard_exit``.

``Phase.PLANNING`` (``STOP.begin_command``): before chunks are dispatched (planning, Prefect's
start, a sink's load). The command's handler (``flows.interrupt_handlers.raise_interrupt``)
raises the first signal as ``KeyboardInterrupt``/``Terminated`` so the cleanups run
(``STOP.hold_or_raise``); a second one exits at once.

``Phase.DISPATCHING`` (``STOP.start_dispatching``): ``flows.signals`` handles the signals while
chunks are in flight, recording in ``STOP.dispatch`` (``embedline.dispatch_stop``) what stops
the dispatch; chunk tasks (worker threads, which signals cannot interrupt) check
``tasks_must_stop()`` before each request.

``Phase.COMMITTING`` (``with STOP.commit_phase()``, entered by
``flows.interrupt_handlers.committing``): the manifest's PUT and the ledger's record of it
happen together; a first signal is raised when the block ends.

``Phase.FINISHING`` (``STOP.enter_finishing``, in the CLI's process only): the run is
committed, and loaded if a sink was asked; what is left is reporting it. The first signal is
held until the flow run has ended (Completed in the Prefect UI, not Crashed) and the CLI raises
it (``STOP.raise_held_interrupt``, which enters ``Phase.ENDED``).

A cancel from Prefect (the UI's Cancel) of a flow run the CLI runs is a SIGTERM that
``flows.cancellation`` sends this process after ``STOP.note_prefect_cancel``: it stops the run
as a SIGTERM does, and ``STOP.stop_cause`` names it.

The pieces around this state live apart: what an interrupt is and its exit code in
``embedline.interrupts``, what stops a dispatch in ``embedline.dispatch_stop``
(``STOP.dispatch``), what the command says at its end (the committed run, work left running,
the API loss and the summary handed over after it) in ``embedline.stop_report``
(``STOP.report``), the hooks to run before the process ends at once in
``embedline.hard_exit_hooks`` (``STOP.exit``), cleanups that outlive ``os._exit`` in
``embedline.exit_cleanups``. This module installs no handler and never exits; it imports
neither Prefect nor an adapter.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from embedline.dispatch_stop import DispatchStop
from embedline.hard_exit_hooks import HardExitHooks
from embedline.interrupts import Terminated
from embedline.stop_report import StopReport

__all__ = ["STOP", "Phase", "StopState", "tasks_must_stop"]


class Phase(enum.Enum):
    """Where the command's run is, as far as a signal is concerned (module docstring)."""

    PLANNING = "planning"  # the first signal raises (``raise_interrupt``)
    DISPATCHING = "dispatching"  # chunks in flight: ``flows.signals`` stops gracefully
    COMMITTING = "committing"  # the commit: the first signal waits for its end
    FINISHING = "finishing"  # only reporting left (CLI): the first signal is held
    ENDED = "ended"  # the flow run has ended; the CLI prints what it returned


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class StopState:
    """The process's stop state: its ``Phase`` and the command's interrupts so far. One per
    process, ``STOP``; a new command (``begin_command``) and a new dispatch
    (``start_dispatching``) clear what belongs to them."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled into a Dask task (a bound method, a hook, Prefect's task context), the stop
        state is the receiving process's own, as a module global's would be: one per process,
        never a copy (its locks and events cannot be copied)."""
        return (_process_stop_state, ())

    def __init__(self) -> None:
        self._phase = Phase.PLANNING
        #: The CLI runs the flow in its own process and handles the signals itself.
        self._run_by_command = False
        #: The signal whose interrupt ``hold_or_raise`` raised and the command is unwinding
        #: from; None before the first.
        self._raised: int | None = None
        #: The signal held while finishing, for ``raise_held_interrupt``.
        self._held: int | None = None
        #: Prefect cancelled the flow run this command runs (``flows.cancellation``).
        self._prefect_cancel = False
        #: What stops the current dispatch (``embedline.dispatch_stop``).
        self.dispatch = DispatchStop(self)
        #: What the command says at its end: committed run, work left running, API loss.
        self.report = StopReport(self)
        #: The hooks to run before the process ends at once (``embedline.hard_exit_hooks``).
        self.exit = HardExitHooks(self)
        self._first_interrupt_hooks: list[Callable[[], None]] = []

    # -- phases ---------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        """The current ``Phase``."""
        return self._phase

    def begin_command(self) -> None:
        """A new command in this process (``cli.main``): ``Phase.PLANNING``; forget the last
        command's interrupt, committed run, held signal, Prefect cancel and that it ran a
        flow (``command_handles_signals``)."""
        self._phase = Phase.PLANNING
        self._raised = self._held = None
        self._run_by_command = self._prefect_cancel = False
        self.report.begin_command()

    def start_dispatching(self) -> None:
        """The flow starts dispatching chunks: ``Phase.DISPATCHING``; what stopped the last
        dispatch (``STOP.dispatch``) is cleared (a long-lived process runs several runs).
        From now on the flow ends by ``report.hand_over`` if the API goes away.

        :raises KeyboardInterrupt: a SIGINT's interrupt was raised before and swallowed
            (``raise_lost_interrupt``); nothing was dispatched.
        :raises Terminated: the same for SIGTERM.
        """
        self.raise_lost_interrupt()
        self._phase = Phase.DISPATCHING
        self.dispatch.clear()
        self.report.dispatching_started()

    @contextlib.contextmanager
    def commit_phase(self) -> Iterator[None]:
        """``Phase.COMMITTING`` for the block; afterwards ``Phase.FINISHING`` if
        ``enter_finishing`` was called in the block, else the phase before it (a sink's load
        or the flow's stop handling). ``flows.interrupt_handlers.committing`` defers
        interrupts over it."""
        before, self._phase = self._phase, Phase.COMMITTING
        try:
            yield
        finally:
            if self._phase is Phase.COMMITTING:
                self._phase = before

    def enter_finishing(self) -> None:
        """``Phase.FINISHING``: the run is committed and only reporting is left; the first
        signal is held from now on (``hold_or_raise``). Entered by
        ``flows.interrupt_handlers.only_reporting_left``, which installs the handler that
        holds it."""
        self._phase = Phase.FINISHING

    def command_handles_signals(self) -> None:
        """Called by the CLI before it runs a flow in its own process. The flow then keeps the
        command's handler for SIGTERM as for SIGINT (``take_over_sigterm``), and holds the
        first signal once the run is finishing (``only_reporting_left``). Never called in a
        Prefect worker's process, where SIGTERM is the runner's way to cancel and keeps
        Prefect's handler."""
        self._run_by_command = True

    def run_by_command(self) -> bool:
        """True in the CLI's own process (``command_handles_signals``); False in a process
        that a Prefect worker, ``serve`` or the user's own code started for the flow run."""
        return self._run_by_command

    # -- the command's interrupt ----------------------------------------------------------

    def interrupt_raised(self) -> bool:
        """True once a first signal was raised (``hold_or_raise``) and not forgotten."""
        return self._raised is not None

    def interrupt_taken(self) -> bool:
        """True once a first signal was raised or held: the next one is a second."""
        return self._raised is not None or self._held is not None

    def hold_or_raise(self, signum: int) -> None:
        """The first signal: held while finishing (``raise_held_interrupt`` raises it), else
        raised.

        :raises KeyboardInterrupt: ``signum`` is SIGINT and the run is not finishing.
        :raises Terminated: the same for SIGTERM.
        """
        if self._phase is Phase.FINISHING:
            self._held = self._held or signum
        else:
            self._raise_first(signum)

    def raise_held_interrupt(self) -> None:
        """The flow run has ended: ``Phase.ENDED``; raise the interrupt of a signal held
        while finishing, if one came.

        :raises KeyboardInterrupt: a SIGINT was held.
        :raises Terminated: a SIGTERM was held.
        """
        held, self._held, self._phase = self._held, None, Phase.ENDED
        if held is not None:
            self._raise_first(held)

    def raise_lost_interrupt(self) -> None:
        """Raise again, at a checkpoint, the interrupt raised before it in
        ``Phase.PLANNING`` if the command is still going: code between the two swallowed it.
        Any ``except BaseException`` that does not re-raise does (a library's lazy import
        that builds a pydantic model turns it into a ``RuntimeError`` that a plugin loader
        logs; a ``__del__`` prints it), and the run would go on to embed and exit 0 after a
        Ctrl-C. Checkpoints: before the CLI runs the flow, and
        ``start_dispatching``. A no-op otherwise, and outside the main thread.

        :raises KeyboardInterrupt: the lost interrupt was a SIGINT's.
        :raises Terminated: it was a SIGTERM's.
        """
        if self._raised is not None and self._phase is Phase.PLANNING and _main_thread():
            self._raise_first(self._raised)

    def forget_interrupts(self) -> None:
        """Forget an interrupt ``hold_or_raise`` raised (one that Python lost and
        ``cli.command_signals.redeliver_lost_interrupts`` sends again)."""
        self._raised = None

    def on_first_interrupt(self, hook: Callable[[], None]) -> None:
        """Register ``hook`` (once) to run as the first interrupt is raised, before any
        cleanup: e.g. silence a library whose teardown, cut short, logs errors the command's
        one line already covers. It must be quick and never raise."""
        if hook not in self._first_interrupt_hooks:
            self._first_interrupt_hooks.append(hook)

    def _raise_first(self, signum: int) -> None:
        self._raised = signum
        for hook in list(self._first_interrupt_hooks):
            hook()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated("the process received SIGTERM")  # Prefect's crash message quotes it

    # -- a cancel from Prefect ------------------------------------------------------------

    def note_prefect_cancel(self) -> bool:
        """Record that Prefect cancelled the flow run this command runs in its own process,
        before ``flows.cancellation`` sends this process the SIGTERM that stops it. Returns
        False, recording nothing, when the command is already stopping on a signal (noted,
        raised or held): a SIGTERM then would count as a second signal and exit at once."""
        if self.dispatch.stop_signal() is not None or self.interrupt_taken():
            return False
        self._prefect_cancel = True
        return True

    def prefect_cancel_requested(self) -> bool:
        """True once ``note_prefect_cancel`` recorded a cancel (until the next command)."""
        return self._prefect_cancel

    def stop_cause(self, signum: int) -> str:
        """What stopped the command, as its summary and last line say it: "cancelled from
        Prefect" for the SIGTERM of a cancel, else "interrupted by SIGINT" (or SIGTERM)."""
        if self._prefect_cancel and signum == signal.SIGTERM:
            return "cancelled from Prefect"
        return f"interrupted by {signal.Signals(signum).name}"


#: The process's stop state.
STOP = StopState()


def _process_stop_state() -> StopState:
    """This process's stop state (what a pickled ``StopState`` becomes)."""
    return STOP


def tasks_must_stop() -> bool:
    """For chunk tasks, before each request: True once ``STOP.dispatch.stop_tasks`` was
    called."""
    return STOP.dispatch.tasks_must_stop()
