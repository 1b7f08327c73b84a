"""A child process of the CLI that must not outlive it (``PR_SET_PDEATHSIG``, Linux prctl(2)).

Light on purpose: a child calls it before its heavy imports, so a ``kill -9`` of the CLI
while the child is still starting ends the child too.
"""

from __future__ import annotations

import os
import signal

__all__ = ["set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def set_parent_death_signal(parent_pid: int) -> None:
    """Ask Linux to SIGTERM this process when its parent dies; no-op elsewhere. Exits at
    once if ``parent_pid`` already died before it took effect."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)
