"""Ending the process at once: a second signal, or the CLI's watchdog after the Prefect API
went away, must not wait for cleanups that take seconds (Prefect's client retries, a server's
shutdown). The hooks registered in ``STOP.exit`` (``embedline.hard_exit_hooks``: stop the
temporary server, mark a started run ``interrupted``) run first, best effort; then
``os._exit``.

Here, not in the core: the flow's process (the CLI's, or one a Prefect worker started) is
what a second signal ends, and ``cli`` calls it too.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from embedline.hard_exit_hooks import HardExitHooks
from embedline.shutdown import STOP

__all__ = ["hard_exit"]


def hard_exit(code: int, hooks: HardExitHooks = STOP.exit) -> NoReturn:
    """Run ``hooks`` (best effort), flush, and end the process now with ``code``."""
    hooks.run_hard_exit_hooks()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
