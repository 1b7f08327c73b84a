"""``flows.interrupt_handlers`` and ``cli.command_signals``: the signal handling outside the
dispatch window, in a child process (a second signal ends the process, by design), and the
``StopState``'s phases they move through."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from embedline.interrupts import SIGNALS
from embedline.shutdown import Phase, StopState
from flows.interrupt_handlers import committing, only_reporting_left, raise_interrupt
from tests.support.fixtures import REPO


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_signal_while_the_first_interrupt_unwinds_exits_at_once() -> None:
    done = _python("""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        install_interrupt_handlers()
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print("first: raised", flush=True)
            signal.raise_signal(signal.SIGTERM)  # during the cleanups
            print("second: not raised", flush=True)
    """)
    assert done.stdout.splitlines() == ["first: raised"]
    assert done.stderr.splitlines() == [
        "embedline: second SIGTERM, exiting now; rerun the same command to resume"
    ]
    assert done.returncode == 143


def test_a_forgotten_interrupt_makes_the_next_signal_a_first_one_again() -> None:
    """A new command in the same process, or an interrupt Python lost and sends again."""
    done = _python("""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        from embedline.shutdown import STOP
        install_interrupt_handlers()
        for _ in range(2):
            try:
                signal.raise_signal(signal.SIGTERM)
            except Terminated:
                print("raised", flush=True)
            STOP.forget_interrupts()
    """)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["raised", "raised"])


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupt_a_library_swallowed_is_raised_again_before_anything_is_dispatched(
    signame: str,
) -> None:
    """CI, a loaded machine: a Ctrl-C inside a lazy import was turned into an error a plugin
    loader logged, and the run embedded and exited 0. The checkpoint raises it again."""
    done = _python(f"""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        from embedline.shutdown import STOP
        install_interrupt_handlers()
        STOP.begin_command()
        try:
            signal.raise_signal(signal.{signame})
        except BaseException:  # what the library did
            print("swallowed", flush=True)
        try:
            STOP.start_dispatching()
            print("dispatching", flush=True)
        except (KeyboardInterrupt, Terminated) as exc:
            print("raised again:", type(exc).__name__, flush=True)
        STOP.begin_command()  # the next command in this process starts clean
        STOP.start_dispatching()
        STOP.raise_lost_interrupt()  # dispatching: flows.signals' business, a no-op here
        print("dispatching", flush=True)
    """)
    raised = "KeyboardInterrupt" if signame == "SIGINT" else "Terminated"
    assert (done.returncode, done.stdout.splitlines(), done.stderr) == (
        0,
        ["swallowed", f"raised again: {raised}", "dispatching"],
        "",
    )


def test_interrupts_deferred_raises_the_first_signal_after_the_block_and_exits_on_a_second() -> (
    None
):
    first = _python("""
        import signal
        from embedline.interrupts import Terminated
        from flows.interrupt_handlers import interrupts_deferred
        try:
            with interrupts_deferred():
                signal.raise_signal(signal.SIGTERM)
                print("block finished", flush=True)
        except Terminated:
            print("raised after", flush=True)
    """)
    assert (first.returncode, first.stdout.splitlines()) == (0, ["block finished", "raised after"])
    second = _python("""
        import signal
        from embedline.interrupts import Terminated
        from flows.interrupt_handlers import interrupts_deferred
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            print("noted", flush=True)
            signal.raise_signal(signal.SIGINT)
            print("not reached", flush=True)
    """)
    assert second.stdout.splitlines() == ["noted"]
    assert second.stderr.splitlines() == [
        "embedline: second SIGINT, exiting now; rerun the same command to resume"
    ]
    assert second.returncode == 130


def test_first_interrupt_hooks_run_before_the_interrupt_is_raised_and_only_then() -> None:
    done = _python("""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        from embedline.shutdown import STOP
        hook = lambda: print("hook", flush=True)
        STOP.on_first_interrupt(hook)
        STOP.on_first_interrupt(hook)  # registered once
        install_interrupt_handlers()
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print("raised", flush=True)
            signal.raise_signal(signal.SIGINT)
    """)
    assert done.stdout.splitlines() == ["hook", "raised"]
    assert done.returncode == 130


def test_a_signal_while_a_committed_run_finishes_is_held_until_the_command_raises_it() -> None:
    """The CLI holds it (Prefect then records the flow run Completed); a second one still
    exits at once, and says the run is committed."""
    held = _python("""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        from embedline.shutdown import STOP
        from flows.interrupt_handlers import interrupts_deferred, only_reporting_left
        install_interrupt_handlers()
        STOP.command_handles_signals()
        with interrupts_deferred():  # the commit
            STOP.report.note_committed("a" * 64, "out/manifests/a.json", "nothing to resume")
            only_reporting_left()
            signal.raise_signal(signal.SIGTERM)
        print("block finished", flush=True)
        signal.raise_signal(signal.SIGTERM)  # Prefect's SIGTERM bridge was replaced too
        print("still held", flush=True)
    """)
    assert held.stdout.splitlines() == ["block finished"]
    assert held.stderr.splitlines() == [
        "embedline: second SIGTERM, exiting now; run aaaaaaaaaaaa is committed: nothing to resume"
    ]
    assert held.returncode == 143
    raised = _python("""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        from embedline.shutdown import STOP
        from flows.interrupt_handlers import only_reporting_left
        install_interrupt_handlers()
        STOP.command_handles_signals()
        only_reporting_left()
        signal.raise_signal(signal.SIGINT)
        print("held", flush=True)
        try:
            STOP.raise_held_interrupt()
        except KeyboardInterrupt:
            print("raised", flush=True)
        STOP.raise_held_interrupt()  # nothing held any more
    """)
    assert (raised.returncode, raised.stdout.splitlines()) == (0, ["held", "raised"])


def test_without_the_command_asking_a_finishing_run_keeps_prefects_signal_handling() -> None:
    """In a Prefect worker's process (a deployment), SIGTERM is the runner's way to cancel:
    ``only_reporting_left`` must leave the handlers alone."""
    done = _python("""
        import signal
        from embedline.interrupts import Terminated
        from embedline.shutdown import STOP
        from flows.interrupt_handlers import only_reporting_left
        mine = lambda signum, frame: print("own handler", flush=True)
        signal.signal(signal.SIGTERM, mine)
        only_reporting_left()
        signal.raise_signal(signal.SIGTERM)
        STOP.raise_held_interrupt()
    """)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["own handler"])


def test_a_prefect_cancel_is_named_as_such_and_never_counts_as_a_second_signal() -> None:
    """``flows.cancellation`` notes a cancel, then sends SIGTERM: the stop is then named
    "cancelled from Prefect". A cancel read while the command already stops on a signal
    (here a Ctrl-C being unwound) records nothing, so no SIGTERM is sent that would exit
    at once as a second signal; a new command forgets the cancel."""
    done = _python("""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        from embedline.shutdown import STOP
        install_interrupt_handlers()
        print(STOP.stop_cause(signal.SIGTERM), STOP.note_prefect_cancel(), flush=True)
        print(STOP.stop_cause(signal.SIGTERM), "|", STOP.stop_cause(signal.SIGINT))
        STOP.begin_command()  # a new command
        print(STOP.prefect_cancel_requested(), flush=True)
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print(STOP.note_prefect_cancel(), STOP.prefect_cancel_requested())
    """)
    assert done.stdout.splitlines() == [
        "interrupted by SIGTERM True",
        "cancelled from Prefect | interrupted by SIGINT",
        "False",
        "False False",
    ], done.stderr
    assert done.returncode == 0, done.stderr


# -- the phases, on a StopState of their own (signal handlers restored after each test) --


@pytest.fixture
def state() -> Iterator[StopState]:
    """A fresh ``StopState``; SIGINT/SIGTERM handlers as they were afterwards."""
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    try:
        yield StopState()
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_cli_run_goes_planning_dispatching_committing_finishing_ended(
    state: StopState,
) -> None:
    assert state.phase is Phase.PLANNING
    state.begin_command()
    state.command_handles_signals()
    state.start_dispatching()
    assert state.phase is Phase.DISPATCHING
    with committing(state):
        assert state.phase is Phase.COMMITTING
        state.report.note_committed("a" * 64, "out/manifests/a.json", "nothing to resume", {"x": 1})
        only_reporting_left(state)
        assert state.phase is Phase.FINISHING
    assert state.phase is Phase.FINISHING  # the commit's end does not undo it
    assert signal.getsignal(signal.SIGTERM) is raise_interrupt  # Prefect's handler replaced
    state.raise_held_interrupt()  # nothing held
    assert state.phase is Phase.ENDED
    state.begin_command()  # the next command forgets the last one
    assert (state.phase, state.report.committed(), state.run_by_command()) == (
        Phase.PLANNING,
        None,
        False,
    )


@pytest.mark.parametrize("start", [Phase.PLANNING, Phase.DISPATCHING])
def test_a_commit_with_a_load_left_returns_to_the_phase_before_it(
    state: StopState, start: Phase
) -> None:
    """The CLI's no-Prefect commit (planning) and a flow's commit before the sink's load
    (dispatching): a signal after the commit is raised again, not held."""
    state.command_handles_signals()
    if start is Phase.DISPATCHING:
        state.start_dispatching()
    with committing(state):
        state.report.note_committed("b" * 64, "out/manifests/b.json", "rerun to load it")
    assert state.phase is start
    committed = state.report.committed()
    assert committed is not None and (committed.todo, committed.summary) == (
        "rerun to load it",
        None,
    )


def test_outside_the_cli_a_committed_run_never_enters_finishing(state: StopState) -> None:
    """A Prefect worker's process: the commit ends back in dispatching, handlers untouched."""
    state.start_dispatching()
    handlers = {signum: signal.getsignal(signum) for signum in SIGNALS}
    with committing(state):
        only_reporting_left(state)
        assert state.phase is Phase.COMMITTING
    assert state.phase is Phase.DISPATCHING
    assert {signum: signal.getsignal(signum) for signum in SIGNALS} == handlers


def test_a_signal_while_committing_is_raised_when_the_commit_ends() -> None:
    done = _python("""
        import signal
        from embedline.interrupts import Terminated
        from cli.command_signals import install_interrupt_handlers
        from embedline.shutdown import STOP
        from flows.interrupt_handlers import committing
        install_interrupt_handlers()
        try:
            with committing():
                signal.raise_signal(signal.SIGTERM)
                print("commit finished", STOP.phase.value, flush=True)
        except Terminated:
            print("raised after", STOP.phase.value, flush=True)
    """)
    assert done.stdout.splitlines() == ["commit finished committing", "raised after planning"]
    assert done.returncode == 0, done.stderr


def test_the_cli_says_one_line_for_an_interrupt_python_wrapped() -> None:
    """A Ctrl-C during in-process planning landed in pyarrow's lazy import of pandas, inside
    a ``__set_name__``: the CLI printed a RuntimeError's traceback, exit 1."""
    done = _python("""
        import sys
        import cli.run

        class Descriptor:
            def __set_name__(self, owner, name):
                raise KeyboardInterrupt

        def planning(args):
            class Imported:  # a module's class body, run while the signal lands
                field = Descriptor()

        cli.run._run = planning
        sys.argv = ["embedline", "run", "in.csv"]
        from cli import entry
        entry()
    """)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "RuntimeError" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("embedline: interrupted by SIGINT"), done.stderr
