"""Graceful stop on SIGINT/SIGTERM while chunks are in flight.

First signal: submit no more chunks and give in-flight chunks ``grace_s`` seconds to finish
(their requests are paid for: let them land); chunks still running then stop before their
next request and are released in the ledger; the run exits 130 (SIGINT) or 143 (SIGTERM).
Second signal: exit at once with the same code
(``flows.interrupt_handlers.exit_on_second_signal``; the ``hard_exit`` hook from
``adapters.ledger.record_hard_stop`` marks the run ``interrupted``); the ledger stays
consistent because every write is one SQLite transaction, and chunks left ``running`` are
reclaimed by the next run on this host as soon as it sees their process is gone.

Prefect 3.9 installs its own SIGTERM handler for the flow run (it raises
``TerminationSignal`` and marks the run Crashed, or Cancelled when the runner asked for a
cancellation). In the CLI's process, ``stop_on_signals`` replaces it while chunks are
dispatched and restores it afterwards.

In a flow run that a Prefect worker or ``serve`` started, SIGTERM is how the runner cancels
it (the UI's Cancel), and the runner sends SIGKILL 30 s later. There Prefect's handler stays
(``dispatch_with_graceful_stop``), and the grace period is capped so that in-flight chunks are
released and recorded before the SIGKILL (``signal_grace_s``).

The Batch API stage (``flows.batch_stage.BatchStage``) is stopped the same way while it submits
and waits: it has ``run`` and ``stop`` as the dispatcher has (``Stoppable``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

from embedline.interrupts import SIGNALS
from embedline.models import ChunkSpec
from embedline.shutdown import STOP
from flows.interrupt_handlers import exit_on_second_signal

__all__ = [
    "RUNNER_KILL_AFTER_S",
    "Stoppable",
    "dispatch_with_graceful_stop",
    "signal_grace_s",
    "stop_on_signals",
    "under_prefect_runner",
]

_R_co = TypeVar("_R_co", covariant=True)


class Stoppable(Protocol[_R_co]):
    """Work a first signal stops gracefully: the chunk dispatcher (``flows.dispatch``), or
    the Batch API stage (``flows.batch_stage``)."""

    def run(self, specs: Sequence[ChunkSpec]) -> _R_co:
        """Do the work of ``specs``; return once done or stopped."""
        ...

    def stop(self, *, grace_s: float | None = None) -> None:
        """Start nothing new; what is in flight gets ``grace_s`` seconds (None: no limit)."""
        ...


#: Seconds from a Prefect runner's SIGTERM to its SIGKILL when it cancels a flow run
#: (Prefect 3.9 ``runner/_cancellation_manager.py``: ``grace_seconds = 30.0``; fixed).
RUNNER_KILL_AFTER_S = 30.0
#: Seconds kept after the grace period for releasing chunks in the ledger, the summary
#: artifact and the final state, before the runner's SIGKILL.
_RECORD_MARGIN_S = 10.0


def under_prefect_runner() -> bool:
    """True in a flow-run process started by a Prefect worker or ``serve``: they set
    ``PREFECT__FLOW_RUN_ID`` for it (Prefect 3.9 ``runner/_starter_engine.py``); the CLI,
    which runs the flow in its own process, does not."""
    return bool(os.environ.get("PREFECT__FLOW_RUN_ID")) and not STOP.run_by_command()


def signal_grace_s(grace_s: float) -> float:
    """The grace period (seconds) in-flight chunks get after the first signal: ``grace_s``,
    at most ``RUNNER_KILL_AFTER_S - 10`` (20 s) under a Prefect runner: with the default
    30 s, a cancelled deployment run would lose that race, SIGKILLed mid-grace, its
    paid-for requests unpublished and the ledger left ``crashed``."""
    if under_prefect_runner():
        return min(grace_s, RUNNER_KILL_AFTER_S - _RECORD_MARGIN_S)
    return grace_s


def dispatch_with_graceful_stop(
    dispatcher: Stoppable[_R_co],
    specs: Sequence[ChunkSpec],
    *,
    grace_s: float,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    stopping: str | None = None,
) -> _R_co:
    """``dispatcher.run(specs)`` with the graceful stop above (``grace_s`` capped by
    ``signal_grace_s``); returns its result. ``stopping``: what the warning logged at the
    first signal says the stop does (default: the chunk dispatcher's grace period).

    Under a Prefect runner, Prefect's own SIGTERM handler stays installed: the runner
    delivers a cancel only to a process whose handler is Prefect's (Prefect 3.9
    ``utilities/engine.commit_control_intent_and_ack``), and only then does the run end
    Cancelled without a traceback. The dispatcher then runs in a thread of its own while
    the main thread, which Prefect's ``TerminationSignal`` interrupts, only waits: the first
    one starts the graceful stop and is kept for ``STOP.dispatch.pending_termination``, which the
    flow raises again once everything is recorded, so Prefect ends the run as it would have.
    """
    grace_s = signal_grace_s(grace_s)
    if not under_prefect_runner() or threading.current_thread() is not threading.main_thread():
        with stop_on_signals(dispatcher, grace_s=grace_s, logger=logger, stopping=stopping):
            return dispatcher.run(specs)
    from prefect.exceptions import TerminationSignal

    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()  # the flow run's context: logger, artifacts

    done = threading.Event()

    def dispatch() -> None:
        try:
            outcome["result"] = context.run(dispatcher.run, specs)
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
            outcome["error"] = exc
        finally:
            done.set()

    # Not Thread.join: interrupted by an exception, Python 3.11's join marks a running
    # thread stopped (bpo-45274's lock handling), and is_alive() turns False.
    thread = threading.Thread(target=dispatch, name="embedline-dispatch", daemon=True)
    with stop_on_signals(
        dispatcher, grace_s=grace_s, logger=logger, signals=(signal.SIGINT,), stopping=stopping
    ):
        thread.start()
        while not done.is_set():
            try:
                done.wait(0.2)
            except TerminationSignal as exc:
                STOP.dispatch.note_termination(exc)
                _stop(signal.SIGTERM, dispatcher, grace_s=grace_s, logger=logger, stopping=stopping)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]  # type: ignore[no-any-return]  # the call's own T


def _stop(
    signum: int,
    dispatcher: Stoppable[Any],
    *,
    grace_s: float,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    stopping: str | None = None,
) -> None:
    """The first signal stops dispatching (in-flight chunks get ``grace_s`` seconds); a
    second one exits at once."""
    if STOP.dispatch.stop_signal() is not None:
        exit_on_second_signal(signum)
    STOP.dispatch.note_stop_signal(signum)
    dispatcher.stop(grace_s=grace_s)
    hint = (
        "the Prefect runner kills this process 30 s after a cancel"
        if under_prefect_runner()
        else "send it again to exit now"
    )
    what = f"{signal.Signals(signum).name} received"
    if STOP.stop_cause(signum).startswith("cancelled"):  # flows.cancellation's SIGTERM
        what, hint = "cancelled from Prefect", "Ctrl-C or SIGTERM exits now"
    stopping = stopping or (
        f"no new chunks; in-flight chunks get {grace_s:g} s to finish, then are released"
    )
    logger.warning("%s: %s (%s)", what, stopping, hint)


@contextlib.contextmanager
def stop_on_signals(
    dispatcher: Stoppable[Any],
    *,
    grace_s: float,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    signals: Sequence[int] = SIGNALS,
    stopping: str | None = None,
) -> Iterator[None]:
    """Install handlers of ``signals`` (default SIGINT and SIGTERM) for the block (main
    thread only; else a no-op). A signal this process inherited as ignored (SIG_IGN: a
    background job of a non-interactive shell, ``nohup``) stays ignored, as Python does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: object) -> None:
        _stop(signum, dispatcher, grace_s=grace_s, logger=logger, stopping=stopping)

    previous = {
        s: signal.signal(s, handle) for s in signals if signal.getsignal(s) is not signal.SIG_IGN
    }  # an inherited SIG_IGN is kept
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
