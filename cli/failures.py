"""How a command fails: the exit codes of docs/reference/cli.md and the one line that says what to
do."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["EXIT_FATAL", "EXIT_USAGE", "exit_on_api_loss", "fail"]

EXIT_USAGE = 2
EXIT_FATAL = 3


def fail(message: str, code: int) -> int:
    """Print ``message`` (one line) to stderr and return ``code``."""
    print(message, file=sys.stderr)
    return code


def exit_on_api_loss(
    loss: Any, *, kept: str = "what was published is kept", todo: str | None = None
) -> None:
    """Print one line for an ``embedline.stop_report.ApiLoss`` and exit 1 at once (the hard-exit
    hooks run first: the temporary server is stopped, a started run marked ``interrupted``).
    ``todo`` replaces the loss's own advice (what a rerun does)."""
    from flows.hard_exit import hard_exit

    sys.stderr.write(f"embedline: error: {loss.what}; {kept}: {todo or loss.todo}\n")
    hard_exit(1)
