"""A cancel from Prefect (the UI's Cancel, ``prefect flow-run cancel``) of a flow run.

Prefect 3.9 acts on a cancel only for a flow run that a runner started (a worker,
``serve``): the runner's ``FlowRunCancellingObserver`` (``prefect/_internal/observers.py``:
an events websocket for ``prefect.flow-run.Cancelling``, polling every 10 s when it is down)
sends the flow's process SIGTERM, and the flow stops gracefully and ends Cancelled
(``end_as_runner_cancellation``). A flow run called in-process, as ``embedline run`` and
``embedline load`` call theirs, has no observer: the server moved the run to Cancelling and
nothing read it. The run embedded and committed every chunk, then the server refused its
final state (Prefect's ``EnforceCancellingToCancelledTransition``: from Cancelling only to
Cancelled): ``UnfinishedRun: Run is in CANCELLING state``, a traceback, exit 1, and the run
shown Cancelling forever.

In the CLI's own process, ``run_stopping_on_cancel`` reads the flow run's state once a second
(one ``GET /flow_runs/{id}``; not the runner's observer, which is Prefect-internal, needs an
event loop and a websocket, and polls every 10 s when that is down). When it reads
Cancelling (or Cancelled), the cancel is a SIGTERM: ``STOP.note_prefect_cancel``, then
SIGTERM to this process, so the run stops wherever it is exactly as for a SIGTERM. Planning
or loading a sink: interrupted at once; dispatching: no new chunks, in-flight chunks get
``--grace``, then are released; committing: after the ledger recorded the commit; after the
commit: held until the flow run has ended. The flow run then ends Cancelled
(``cancelled_or``), except after the commit: nothing was stopped, so it ends Completed (its
state history shows the cancel, then a Running state that says why:
``complete_despite_cancel``), as a run that finished a second before the cancel does.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from prefect import get_run_logger
from prefect.client.schemas.objects import State
from prefect.runtime import flow_run
from prefect.states import Cancelled, Running

from embedline.interrupts import Terminated, is_interrupt, signal_of
from embedline.shutdown import STOP
from flows.interrupt_handlers import take_over_sigterm

__all__ = [
    "POLL_S",
    "InterruptedByCancel",
    "cancelled_or",
    "complete_despite_cancel",
    "end_as_runner_cancellation",
    "raise_if_interrupted_by_cancel",
    "run_stopping_on_cancel",
]

#: Seconds between two reads of the flow run's state (one light API call each).
POLL_S = 1.0
_CANCEL_STATE_TYPES = ("CANCELLING", "CANCELLED")

T = TypeVar("T")


class InterruptedByCancel(Exception):
    """The data of the Cancelled state of a flow run that a cancel interrupted before it had
    a summary (planning, waiting for a sink's load): the CLI then ends as after a SIGTERM
    there (``raise_if_interrupted_by_cancel``): one line, exit 143."""


def run_stopping_on_cancel(body: Callable[[], T], *, poll_s: float = POLL_S) -> T | State[Any]:
    """``body()`` in a flow run; in the CLI's process (``STOP.run_by_command``) watched
    for a cancel from Prefect, which stops it as a SIGTERM does (module docstring).

    Returns ``body()``'s result, or a Cancelled state carrying ``InterruptedByCancel`` when
    the cancel's SIGTERM interrupted ``body`` (the ledger's run, if recorded, then reads
    ``interrupted``). Any other exception, a Ctrl-C included, propagates.
    """
    flow_run_id = flow_run.get_id()
    if not STOP.run_by_command() or not flow_run_id:
        return body()  # a runner's process: its SIGTERM is the cancel
    take_over_sigterm()  # the cancel's SIGTERM reaches the command's handler
    watch = _CancelWatch(str(flow_run_id), poll_s)
    try:
        with watch:
            return body()
    except BaseException as exc:
        if not (
            STOP.prefect_cancel_requested()
            and is_interrupt(exc)
            and signal_of(exc) == signal.SIGTERM
        ):
            raise
        committed = STOP.report.committed()
        after, todo = "", "rerun the same command to resume"
        if committed is not None:
            after, todo = f" after run {committed.run_key[:12]} was committed", committed.todo
        message = f"cancelled from Prefect{after}; {todo}"
        get_run_logger().warning("stopped: %s", message)
        return Cancelled(message=message, data=InterruptedByCancel(message))


def cancelled_or(state: State[Any]) -> State[Any]:
    """The final state of a flow run that did not complete: ``state`` (Failed), or, if
    Prefect cancelled the run, Cancelled with the same message and data (from Cancelling the
    server accepts only Cancelled)."""
    if not _cancel_requested():
        return state
    return Cancelled(message=state.message, data=state.data)


def complete_despite_cancel() -> None:
    """Before a flow run that completed proposes Completed: if Prefect cancelled it (the
    cancel came after the commit, and stopped nothing), force the flow run from Cancelling
    back to Running, with a message that says so, so that the server accepts the Completed
    state (from Cancelling it accepts only Cancelled), which then fires what waits for
    Completed once. If that call fails, the flow run stays Cancelling (logged)."""
    if not _cancel_requested():
        return
    import httpx
    from prefect.client.orchestration import get_client

    note = "a cancel arrived after the run was committed: nothing was stopped"
    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(str(flow_run.get_id()), Running(message=note), force=True)
    except httpx.HTTPError as exc:
        get_run_logger().warning(
            "could not record that the run completed (%s): %s; the flow run stays Cancelling",
            note,
            exc,
        )


def _cancel_requested() -> bool:
    """A cancel the watch saw, or, in the CLI's process, one the flow run's state shows now:
    it came after the watch's last read (up to ``POLL_S`` before the run ended), too late to
    stop anything, but the final state must still be one the server accepts. One API call;
    none once the API is lost (the CLI has the summary and exits)."""
    if STOP.prefect_cancel_requested():
        return True
    flow_run_id = flow_run.get_id()
    if not STOP.run_by_command() or not flow_run_id or STOP.report.api_lost() is not None:
        return False
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return _reads_cancel(client, str(flow_run_id))


def _reads_cancel(client: Any, flow_run_id: str) -> bool:
    """The flow run's state is Cancelling or Cancelled; False when the API does not answer
    (the CLI's API watchdog decides about a lost API)."""
    import httpx
    from prefect.exceptions import ObjectNotFound

    try:
        state = client.read_flow_run(flow_run_id).state
    except (httpx.HTTPError, ObjectNotFound):
        return False
    return state is not None and state.type.value in _CANCEL_STATE_TYPES


def raise_if_interrupted_by_cancel(data: object) -> None:
    """In the CLI, after the flow: ``data`` (a flow state's) says a cancel interrupted the
    run before it had a summary; end as a SIGTERM there would (``cli.main``: one line, 143).

    :raises Terminated: if ``data`` is ``InterruptedByCancel``.
    """
    if isinstance(data, InterruptedByCancel):
        raise Terminated("the flow run was cancelled from Prefect")


def end_as_runner_cancellation(message: str) -> None:
    """A run under a Prefect runner that stopped gracefully on Prefect's SIGTERM (the UI's
    Cancel, ``prefect flow-run cancel``): everything is recorded; raise the kept
    ``TerminationSignal`` again, so Prefect ends the run as it would have at once: Cancelled
    for a cancel (exit 0, no traceback), Crashed otherwise. A Failed state returned into
    ``Cancelling`` would leave the run ``Cancelling``, with an ``UnfinishedRun``
    traceback, exit 1 and the worker's "general error" line.

    :raises TerminationSignal: kept by ``STOP.dispatch.note_termination``; else returns.
    """
    termination = STOP.dispatch.pending_termination()
    if termination is None:
        return
    get_run_logger().warning("stopped: %s", message)
    raise termination


class _CancelWatch:
    """A daemon thread that reads the flow run's state every ``poll_s`` seconds while the
    ``with`` block runs, and stops the run (SIGTERM to this process) once it reads a cancel.
    Nothing is sent once the block has ended: a poll still waiting on the API (Prefect's
    client retries a lost one for about a minute) is left to end on its own."""

    def __init__(self, flow_run_id: str, poll_s: float) -> None:
        self.flow_run_id = flow_run_id
        self.poll_s = poll_s
        self._ended = threading.Event()
        self._lock = threading.Lock()  # a SIGTERM is sent only before the block ends

    def __enter__(self) -> _CancelWatch:
        threading.Thread(target=self._watch, name="embedline-cancel-watch", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._ended.set()

    def _watch(self) -> None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while not self._ended.wait(self.poll_s):
                if _reads_cancel(client, self.flow_run_id):
                    with self._lock:
                        if not self._ended.is_set() and STOP.note_prefect_cancel():
                            os.kill(os.getpid(), signal.SIGTERM)
                    return
