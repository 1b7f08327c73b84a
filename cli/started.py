"""When the command started, and the line an interrupted command ends with.

A leaf module (stdlib only) that the ``cli`` package imports first and the commands import
directly, so no command module imports the package back (no import cycle).
"""

from __future__ import annotations

import signal
import time

__all__ = ["STARTED_AT", "interrupted_line"]

#: ``time.monotonic()`` when the command started (``cli/__init__`` imports this module first).
STARTED_AT = time.monotonic()


def interrupted_line(
    signum: int,
    after: str = "",
    todo: str | None = "; rerun the same command to resume",
    cause: str | None = None,
) -> str:
    """The one line an interrupted command ends with (here and in ``cli.main``): ``after``
    says when (e.g. " after run X was committed (URI)"), ``todo`` what to do (None: nothing,
    for a read-only command), ``cause`` what stopped it (default "interrupted by SIGINT";
    ``STOP.stop_cause``)."""
    cause = cause or f"interrupted by {signal.Signals(signum).name}"
    return f"embedline: {cause}{after}{todo or ''}\n"
