"""Process-wide stop state for SIGINT/SIGTERM, shared by the command, the flow and its chunk
tasks: one ``StopState``, ``STOP``, whose ``Phase`` says who handles a signal now.

``Phase.PLANNING`` (``STOP.begin_command``): before chunks are dispatched (planning, Prefect's
start, a sink's load). ``raise_interrupt`` is the command's handler: the first signal raises
``KeyboardInterrupt``/``Terminated`` so the cleanups run, a second one exits at once;
``STOP.interrupts_deferred()`` holds the first back over a step that must not be cut in two
(``import prefect``).

``Phase.DISPATCHING`` (``STOP.start_dispatching``): ``flows.signals`` handles the signals while
chunks are in flight. First signal: ``STOP.note_stop_signal`` — the run submits no new chunks;
in-flight chunks keep going. When the grace period runs out, ``STOP.stop_tasks`` — chunk tasks
(worker threads, which signals cannot interrupt) check ``tasks_must_stop()`` before each
request and raise ``StopRequestedError``, so their chunk is released for the next run. Second
signal: ``STOP.exit.hard_exit`` — run the registered hooks (e.g. stop Prefect's temporary server)
and exit.

``Phase.COMMITTING`` (``with STOP.committing()``): the manifest's PUT and the ledger's record of
it happen together; a first signal is raised when the block ends, a second exits at once.

``Phase.FINISHING`` (``STOP.only_reporting_left``, in the CLI's process only): the run is
committed, and loaded if a sink was asked; what is left is reporting it. The first signal is
held until the flow run has ended (Completed in the Prefect UI, not Crashed) and the CLI raises
it (``STOP.raise_held_interrupt``, which enters ``Phase.ENDED``). In a flow the CLI runs,
SIGTERM keeps the command's handler too (``STOP.take_over_sigterm``), not Prefect's.

The Prefect API going away mid-run (the CLI's watchdog: a configured server that stops
answering, or the temporary server's process exiting) is a stop of the same kind:
``STOP.report.note_api_lost`` — the dispatcher submits no new chunks and gives in-flight ones
the grace period; the flow records the outcome in the ledger and ``STOP.report.hand_over``s its
summary to the waiting CLI thread (``STOP.report.wait_for_hand_over``), which prints it and
exits without waiting for Prefect's client, whose retries of each call take about a minute
(2+4+8+16+32 s).

A cancel from Prefect (the UI's Cancel) of a flow run the CLI runs is a SIGTERM that
``flows.cancellation`` sends this process after ``STOP.note_prefect_cancel``: it stops the run
as a SIGTERM does, and ``STOP.stop_cause`` names it.

The pieces around this state live apart: what an interrupt is and its exit code in
``embedline.interrupts``, what the command says at its end (the committed run, work left
running, the API loss) in ``embedline.stop_report`` (``STOP.report``), cleanups that outlive
``os._exit`` in ``embedline.exit_cleanups``, ending the process at once in
``embedline.hard_exit`` (``STOP.exit``). This module installs the command's signal handlers;
it imports neither Prefect nor an adapter.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from embedline.hard_exit import HardExit
from embedline.interrupts import SIGNALS, Terminated, exit_code_for, interrupt_of, signal_of
from embedline.stop_report import StopReport

__all__ = ["STOP", "Phase", "StopState", "raise_interrupt", "tasks_must_stop"]


class Phase(enum.Enum):
    """Where the command's run is, as far as a signal is concerned (module docstring)."""

    PLANNING = "planning"  # the first signal raises (``raise_interrupt``)
    DISPATCHING = "dispatching"  # chunks in flight: ``flows.signals`` stops gracefully
    COMMITTING = "committing"  # the commit: the first signal waits for its end
    FINISHING = "finishing"  # only reporting left (CLI): the first signal is held
    ENDED = "ended"  # the flow run has ended; the CLI prints what it returned


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


#: Seconds between the end of the hook that caught a lost interrupt and its signal sent
#: again: long enough for the hook to return, short enough to feel immediate.
_REDELIVER_AFTER_S = 0.05


class StopState:
    """The process's stop state: its ``Phase`` and what a stop has recorded so far. One per
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
        #: The signal whose interrupt ``raise_interrupt`` (or ``interrupts_deferred``) raised
        #: and the command is unwinding from; None before the first.
        self._raised: int | None = None
        #: The signal held while finishing, for ``raise_held_interrupt``.
        self._held: int | None = None
        #: The signal that stopped dispatching (``note_stop_signal``).
        self._signal: int | None = None
        #: Prefect's ``TerminationSignal`` that started a graceful stop under a runner.
        self._termination: BaseException | None = None
        #: Prefect cancelled the flow run this command runs (``flows.cancellation``).
        self._prefect_cancel = False
        #: What the command says at its end: committed run, work left running, API loss.
        self.report = StopReport(self)
        self._tasks_stop = threading.Event()
        #: Ending the process at once, after its hooks (``embedline.hard_exit``).
        self.exit = HardExit(self)
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
        """The flow starts dispatching chunks: ``Phase.DISPATCHING``; the stop signal, kept
        termination and the chunk tasks' stop are cleared (a long-lived process runs several
        runs). From now on the flow ends by ``report.hand_over`` if the API goes away.

        :raises KeyboardInterrupt: a SIGINT's interrupt was raised before and swallowed
            (``raise_lost_interrupt``); nothing was dispatched.
        :raises Terminated: the same for SIGTERM.
        """
        self.raise_lost_interrupt()
        self._phase = Phase.DISPATCHING
        self._signal = self._termination = None
        self._tasks_stop.clear()
        self.report.dispatching_started()

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """``Phase.COMMITTING`` for the block, with interrupts deferred
        (``interrupts_deferred``): the manifest's PUT and the ledger's record of it happen
        together. Afterwards ``Phase.FINISHING`` if ``only_reporting_left`` was called in the
        block, else the phase before it (a sink's load or the flow's stop handling)."""
        before, self._phase = self._phase, Phase.COMMITTING
        try:
            with self.interrupts_deferred():
                yield
        finally:
            if self._phase is Phase.COMMITTING:
                self._phase = before

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

    def take_over_sigterm(self) -> None:
        """In a flow run by the CLI: put ``raise_interrupt`` back for SIGTERM in place of the
        handler Prefect 3.9 installs for the flow run (``capture_sigterm``, which raises
        ``TerminationSignal``), so SIGTERM is handled as SIGINT is: the first raises
        ``Terminated`` (Prefect records the flow run Crashed, the run is marked
        ``interrupted``), a second one while those cleanups run exits at once
        (``exit_on_second_signal``) instead of being raised inside those cleanups, which would
        leave the ledger's run ``running``. Prefect restores the command's handler when the
        flow run ends. A no-op unless ``command_handles_signals``; main thread
        only."""
        if not self._run_by_command or not _main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, raise_interrupt)

    def only_reporting_left(self) -> None:
        """The flow's run is committed (and loaded, if a sink was asked): what is left is
        reporting it, and Prefect recording the flow run's final state. A signal from now on
        stops nothing; raised, it would make Prefect mark the committed run's flow run
        Crashed.
        With ``command_handles_signals``: ``Phase.FINISHING``, ``raise_interrupt`` installed
        (in place of Prefect's SIGTERM handler too), and the first signal held. Main thread
        only; else (and in a Prefect worker's process) a no-op."""
        if not self._run_by_command or not _main_thread():
            return
        self._phase = Phase.FINISHING
        for signum in SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, raise_interrupt)

    def raise_held_interrupt(self) -> None:
        """The flow run has ended: ``Phase.ENDED``; raise the interrupt of a signal held
        while finishing, if one came.

        :raises KeyboardInterrupt: a SIGINT was held.
        :raises Terminated: a SIGTERM was held.
        """
        held, self._held, self._phase = self._held, None, Phase.ENDED
        if held is not None:
            self._raise_first(held)

    # -- the command's handler ------------------------------------------------------------

    def install_interrupt_handlers(self) -> dict[int, Any]:
        """Install ``raise_interrupt`` for SIGINT and SIGTERM where Python's defaults are in
        place (main thread only); return the handlers it replaced, to restore. An inherited
        SIG_IGN (a supervisor, ``nohup``) is kept, and so is any handler already
        installed."""
        if not _main_thread():
            return {}
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        return {
            signum: signal.signal(signum, raise_interrupt)
            for signum, default in defaults.items()
            if signal.getsignal(signum) == default
        }

    def raise_interrupt(self, signum: int) -> None:
        """``raise_interrupt``'s body: see there."""
        if self._raised is not None or self._held is not None:
            self.exit_on_second_signal(signum)
        self._hold_or_raise(signum)

    @contextlib.contextmanager
    def interrupts_deferred(self) -> Iterator[None]:
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
            if noted or self._raised is not None:
                self.exit_on_second_signal(signum)
            noted.append(signum)

        previous = {
            s: signal.signal(s, note) for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN
        }
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, raise_interrupt if self._holding() else handler)
        if noted:
            self._hold_or_raise(noted[0])

    def on_first_interrupt(self, hook: Callable[[], None]) -> None:
        """Register ``hook`` (once) to run as ``raise_interrupt`` raises the first interrupt,
        before any cleanup: e.g. silence a library whose teardown, cut short, logs errors the
        command's one line already covers. It must be quick and never raise."""
        if hook not in self._first_interrupt_hooks:
            self._first_interrupt_hooks.append(hook)

    def exit_on_second_signal(self, signum: int) -> None:
        """Say so in one line and ``hard_exit`` with 128 + ``signum`` (its hooks stop the
        temporary server and mark the run ``interrupted``). Never returns."""
        todo = "rerun the same command to resume"
        committed = self.report.committed()
        if committed is not None:
            todo = f"run {committed.run_key[:12]} is committed: {committed.todo}"
        sys.stderr.write(f"embedline: second {signal.Signals(signum).name}, exiting now; {todo}\n")
        self.exit.hard_exit(exit_code_for(signum))

    def raise_lost_interrupt(self) -> None:
        """Raise again, at a checkpoint, the interrupt ``raise_interrupt`` raised before it in
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
        """Forget an interrupt ``raise_interrupt`` raised (one that Python lost and
        ``redeliver_lost_interrupts`` sends again)."""
        self._raised = None

    def redeliver_lost_interrupts(self, unraisable: Any) -> bool:
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
        self.forget_interrupts()  # the one redelivered is a first signal, not a second
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

    def _holding(self) -> bool:
        return self._phase is Phase.FINISHING

    def _hold_or_raise(self, signum: int) -> None:
        """The first signal: held while finishing, else raised."""
        if self._holding():
            self._held = self._held or signum
        else:
            self._raise_first(signum)

    def _raise_first(self, signum: int) -> None:
        self._raised = signum
        for hook in list(self._first_interrupt_hooks):
            hook()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated("the process received SIGTERM")  # Prefect's crash message quotes it

    # -- a stop while dispatching ---------------------------------------------------------

    def note_stop_signal(self, signum: int) -> None:
        """``flows.signals``: the first signal while dispatching is recorded (the run is
        stopping because of ``signum``); a second one exits at once
        (``exit_on_second_signal``)."""
        if self._signal is not None:
            self.exit_on_second_signal(signum)
        self._signal = signum

    def stop_signal(self) -> int | None:
        """The signal that is stopping the dispatch, if any."""
        return self._signal

    def note_termination(self, exc: BaseException) -> None:
        """Keep Prefect's ``TerminationSignal`` that started a graceful stop in a flow run
        under a Prefect runner, for the flow to raise again once the run is recorded (the
        first one only)."""
        if self._termination is None:
            self._termination = exc

    def pending_termination(self) -> BaseException | None:
        """The ``TerminationSignal`` ``note_termination`` kept, if any."""
        return self._termination

    def stop_tasks(self) -> None:
        """Ask every chunk task of this process to stop before its next request."""
        self._tasks_stop.set()

    def tasks_must_stop(self) -> bool:
        """True once ``stop_tasks`` was called (until ``start_dispatching``)."""
        return self._tasks_stop.is_set()

    def note_prefect_cancel(self) -> bool:
        """Record that Prefect cancelled the flow run this command runs in its own process,
        before ``flows.cancellation`` sends this process the SIGTERM that stops it. Returns
        False, recording nothing, when the command is already stopping on a signal (noted,
        raised or held): a SIGTERM then would count as a second signal and exit at once."""
        if self._signal is not None or self._raised is not None or self._held is not None:
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


def raise_interrupt(signum: int, frame: object) -> None:
    """The command's SIGINT/SIGTERM handler outside the dispatch window (where
    ``flows.signals`` handles them). The first signal raises ``KeyboardInterrupt`` (SIGINT)
    or ``Terminated`` (SIGTERM) in the main thread, so the cleanups run: the temporary
    server stops, a started run is marked ``interrupted``. Those take seconds; a second
    signal while they run exits at once (``STOP.exit_on_second_signal``), as Prefect's CLI
    and pip do for a second Ctrl-C.

    In ``Phase.FINISHING`` the first signal is held instead: ``STOP.raise_held_interrupt``
    raises it once the flow run has ended.

    :raises KeyboardInterrupt: for the first SIGINT.
    :raises Terminated: for the first SIGTERM.
    """
    STOP.raise_interrupt(signum)


def tasks_must_stop() -> bool:
    """For chunk tasks, before each request: True once ``STOP.stop_tasks`` was called."""
    return STOP.tasks_must_stop()
