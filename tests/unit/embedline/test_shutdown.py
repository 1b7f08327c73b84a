"""``embedline.shutdown``'s signal handling outside the dispatch window, in a child process
(a second signal ends the process, by design)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.fixtures import REPO


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_second_signal_while_the_first_interrupt_unwinds_exits_at_once() -> None:
    done = _python("""
        import signal
        from embedline import shutdown
        shutdown.install_interrupt_handlers()
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print("first: raised", flush=True)
            signal.raise_signal(signal.SIGTERM)  # during the cleanups
            print("second: not raised", flush=True)
    """)
    assert done.stdout.splitlines() == ["first: raised"]
    assert done.stderr.splitlines() == [
        "embedline: second SIGTERM, exiting now; rerun the same command to resume"]
    assert done.returncode == 143


def test_a_forgotten_interrupt_makes_the_next_signal_a_first_one_again() -> None:
    """A new command in the same process, or an interrupt Python lost and sends again."""
    done = _python("""
        import signal
        from embedline import shutdown
        shutdown.install_interrupt_handlers()
        for _ in range(2):
            try:
                signal.raise_signal(signal.SIGTERM)
            except shutdown.Terminated:
                print("raised", flush=True)
            shutdown.forget_interrupts()
    """)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["raised", "raised"])


def test_interrupts_deferred_raises_the_first_signal_after_the_block_and_exits_on_a_second(
) -> None:  # fmt: skip
    first = _python("""
        import signal
        from embedline import shutdown
        try:
            with shutdown.interrupts_deferred():
                signal.raise_signal(signal.SIGTERM)
                print("block finished", flush=True)
        except shutdown.Terminated:
            print("raised after", flush=True)
    """)
    assert (first.returncode, first.stdout.splitlines()) == (0, ["block finished", "raised after"])
    second = _python("""
        import signal
        from embedline import shutdown
        with shutdown.interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            print("noted", flush=True)
            signal.raise_signal(signal.SIGINT)
            print("not reached", flush=True)
    """)
    assert second.stdout.splitlines() == ["noted"]
    assert second.stderr.splitlines() == [
        "embedline: second SIGINT, exiting now; rerun the same command to resume"]
    assert second.returncode == 130


def test_first_interrupt_hooks_run_before_the_interrupt_is_raised_and_only_then() -> None:
    done = _python("""
        import signal
        from embedline import shutdown
        hook = lambda: print("hook", flush=True)
        shutdown.on_first_interrupt(hook)
        shutdown.on_first_interrupt(hook)  # registered once
        shutdown.install_interrupt_handlers()
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
        from embedline import shutdown
        shutdown.install_interrupt_handlers()
        shutdown.command_handles_signals()
        with shutdown.interrupts_deferred():  # the commit
            shutdown.note_committed("a" * 64, "out/manifests/a.json", "nothing to resume")
            shutdown.note_finishing()
            signal.raise_signal(signal.SIGTERM)
        print("block finished", flush=True)
        signal.raise_signal(signal.SIGTERM)  # Prefect's SIGTERM bridge was replaced too
        print("still held", flush=True)
    """)
    assert held.stdout.splitlines() == ["block finished"]
    assert held.stderr.splitlines() == ["embedline: second SIGTERM, exiting now; run "
                                        "aaaaaaaaaaaa is committed: nothing to resume"]
    assert held.returncode == 143
    raised = _python("""
        import signal
        from embedline import shutdown
        shutdown.install_interrupt_handlers()
        shutdown.command_handles_signals()
        shutdown.note_finishing()
        signal.raise_signal(signal.SIGINT)
        print("held", flush=True)
        try:
            shutdown.raise_held_interrupt()
        except KeyboardInterrupt:
            print("raised", flush=True)
        shutdown.raise_held_interrupt()  # nothing held any more
    """)
    assert (raised.returncode, raised.stdout.splitlines()) == (0, ["held", "raised"])


def test_without_the_command_asking_a_finishing_run_keeps_prefects_signal_handling() -> None:
    """In a Prefect worker's process (a deployment), SIGTERM is the runner's way to cancel:
    ``note_finishing`` must leave the handlers alone."""
    done = _python("""
        import signal
        from embedline import shutdown
        mine = lambda signum, frame: print("own handler", flush=True)
        signal.signal(signal.SIGTERM, mine)
        shutdown.note_finishing()
        signal.raise_signal(signal.SIGTERM)
        shutdown.raise_held_interrupt()
    """)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["own handler"])


def test_a_prefect_cancel_is_named_as_such_and_never_counts_as_a_second_signal() -> None:
    """``flows.cancellation`` notes a cancel, then sends SIGTERM: the stop is then named
    "cancelled from Prefect". A cancel read while the command already stops on a signal
    (here a Ctrl-C being unwound) records nothing, so no SIGTERM is sent that would exit
    at once as a second signal; a new command forgets the cancel."""
    done = _python("""
        import signal
        from embedline import shutdown
        shutdown.install_interrupt_handlers()
        print(shutdown.stop_cause(signal.SIGTERM), shutdown.note_prefect_cancel(), flush=True)
        print(shutdown.stop_cause(signal.SIGTERM), "|", shutdown.stop_cause(signal.SIGINT))
        shutdown.note_committed(None)  # a new command
        print(shutdown.prefect_cancel_requested(), flush=True)
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print(shutdown.note_prefect_cancel(), shutdown.prefect_cancel_requested())
    """)
    assert done.stdout.splitlines() == [
        "interrupted by SIGTERM True",
        "cancelled from Prefect | interrupted by SIGINT",
        "False",
        "False False",
    ], done.stderr
    assert done.returncode == 0, done.stderr
