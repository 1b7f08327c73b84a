"""``embedline.shutdown``: the process's stop state, plain state shared by the command, the flow
and its chunk tasks (its handlers are ``flows.interrupt_handlers``'s)."""

from __future__ import annotations

import signal
import threading
import time

from embedline.shutdown import StopState
from embedline.stop_report import ApiLoss


def test_starting_to_dispatch_clears_the_last_runs_stop() -> None:
    state = StopState()
    state.dispatch.note_stop_signal(signal.SIGINT)
    state.dispatch.note_termination(RuntimeError("TerminationSignal"))
    state.dispatch.stop_tasks()
    assert (state.dispatch.stop_signal(), state.dispatch.tasks_must_stop()) == (signal.SIGINT, True)
    state.start_dispatching()
    assert (
        state.dispatch.stop_signal(),
        state.dispatch.pending_termination(),
        state.dispatch.tasks_must_stop(),
    ) == (
        None,
        None,
        False,
    )


def test_the_cli_waits_for_a_hand_over_only_once_the_flow_dispatches() -> None:
    state = StopState()
    started = time.monotonic()
    assert state.report.wait_for_hand_over(5.0) is None  # planning: nothing will come
    assert time.monotonic() - started < 1.0
    state.start_dispatching()
    assert state.report.hand_over({"exit_code": 1}) is False  # no API loss: nobody waits
    state.report.note_api_lost(ApiLoss("the Prefect API went away", "rerun"))
    threading.Timer(0.2, state.report.hand_over, args=({"exit_code": 1},)).start()
    assert state.report.wait_for_hand_over(5.0) == {"exit_code": 1}


def test_the_stop_state_pickles_as_the_receiving_processs_own() -> None:
    """A Dask task carrying it (a bound method, a hook) must not copy its locks: pickled, it is
    the process's one ``STOP`` (the stop-state refactor broke every Dask run with
    "cannot pickle '_thread.lock' object")."""
    import pickle

    import cloudpickle

    from embedline.shutdown import STOP

    assert pickle.loads(pickle.dumps(STOP)) is STOP
    assert (
        cloudpickle.loads(cloudpickle.dumps(STOP.dispatch.tasks_must_stop))()
        is STOP.dispatch.tasks_must_stop()
    )


def _interrupt_in_set_name() -> BaseException:
    """What a Ctrl-C inside a descriptor's ``__set_name__`` (a class body run by an import)
    raises: on Python 3.11 a RuntimeError from the KeyboardInterrupt."""

    class Descriptor:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    try:
        type("Owner", (), {"field": Descriptor()})
    except BaseException as exc:  # noqa: BLE001 - whatever this Python raises
        return exc
    raise AssertionError("__set_name__ was not called")


def test_an_interrupt_wrapped_by_python_is_still_an_interrupt() -> None:
    from embedline.interrupts import interrupt_of

    raised = _interrupt_in_set_name()
    found = interrupt_of(raised)
    assert isinstance(found, KeyboardInterrupt), repr(raised)
    unrelated = RuntimeError("a bug")
    unrelated.__cause__ = ValueError("its cause")
    assert interrupt_of(unrelated) is None
    looped = RuntimeError("loop")
    looped.__cause__ = looped
    assert interrupt_of(looped) is None
