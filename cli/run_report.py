"""What ``embedline run`` prints when a run ends: its summary and a sink load's on stdout,
one last line on stderr when the run did not complete; and the same from the watchdog thread
when the Prefect API went away mid-run, which then ends the process without waiting for
Prefect's client retries."""

from __future__ import annotations

import os
import sys
from typing import Any

from cli.failures import exit_on_api_loss
from embedline.interrupts import is_interrupt_exit
from embedline.shutdown import STOP
from embedline.tracebacks import DEBUG_ENV
from flows.hard_exit import hard_exit

__all__ = ["print_summaries", "say_why_not_complete", "stop_after_api_loss"]

#: Seconds, beyond ``--grace``, that the flow gets to record its chunks and summary after
#: the Prefect API went away (ledger and store writes only: no API call).
_HAND_OVER_MARGIN_S = 10.0
#: Prefect's loggers that report each failed call to a lost API (an event dump per line).
_API_NOISE_LOGGERS = ("prefect.events.clients", "prefect._internal.concurrency")


def print_summaries(
    summary: dict[str, Any], load: dict[str, Any] | None = None, *, command_s: float | None = None
) -> None:
    """Print the run's summary on stdout (``command_s``: the command's seconds, if known),
    then the summary of its sink load, if one ran (a load's failure is said once, in the
    run's last line: ``say_why_not_complete``)."""
    from cli.console import print_summary

    print_summary(summary, command_s=command_s)
    if load:
        from cli.load import print_load_summary

        print_load_summary(load, message=False)


def say_why_not_complete(summary: dict[str, Any]) -> None:
    """End stderr with the summary's message, one line, when the run did not complete (the
    counts are on stdout; stderr ended with Prefect's last log line)."""
    code = int(summary["exit_code"])
    if code:
        # interrupted, or stepped aside for an earlier run (exit 75): no error of the run's
        quiet = is_interrupt_exit(code) or summary["status"] == "stepped_aside"
        sys.stderr.write(f"embedline: {'' if quiet else 'error: '}{summary['message']}\n")


def stop_after_api_loss(loss: Any, grace_s: float) -> None:
    """Watchdog thread, the Prefect API gone mid-run: the flow stops dispatching (in-flight
    chunks get ``grace_s`` seconds), records every outcome in the ledger and hands its
    summary over; print it and one line, and exit with its code (1: rerun resumes) without
    waiting for Prefect's client retries. At most ``grace_s + _HAND_OVER_MARGIN_S`` seconds;
    none once only reporting is left (``STOP.report.committed().summary``): a run committed
    just before the API went away is reported as committed at once, not as work to resume."""
    import logging

    from cli.console import command_seconds, print_summary, stop_progress

    if not os.environ.get(DEBUG_ENV):
        for name in _API_NOISE_LOGGERS:
            logging.getLogger(name).disabled = True  # Prefect's SafeLogger ignores levels
    STOP.report.note_api_lost(loss)
    # Committed and nothing left but reporting: the flow's last steps are Prefect calls
    # that would retry for a minute; the summary is known
    committed = STOP.report.committed()
    summary = committed.summary if committed is not None else None
    if summary is None:
        summary = STOP.report.wait_for_hand_over(grace_s + _HAND_OVER_MARGIN_S)
    if summary is None:  # not dispatching yet, or stuck: the next run reclaims its chunks
        committed = STOP.report.committed()  # the flow may have committed while this waited
        if committed is None:
            exit_on_api_loss(loss)
        else:  # a sink's load was left: the rerun does only that
            exit_on_api_loss(
                loss, kept=f"run {committed.run_key[:12]} is committed", todo=committed.todo
            )
        return
    code = int(summary["exit_code"])
    try:  # whatever printing does, this thread ends the process
        stop_progress()
        print_summary(summary, command_s=command_seconds())
        if summary.get("load"):
            from cli.load import print_load_summary

            print_load_summary(summary["load"], message=False)
        if code:
            sys.stderr.write(f"embedline: error: {summary['message']}\n")
        else:
            sys.stderr.write(
                f"embedline: warning: {loss.what} after the run completed; "
                "this run is missing from the Prefect UI\n"
            )
    finally:
        hard_exit(code)
