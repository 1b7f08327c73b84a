"""Processes of this host: is one gone (to reclaim leases and temp files of killed runs),
and a child that must not outlive its parent."""

from __future__ import annotations

import os
import signal

__all__ = ["local_process_is_gone", "set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def set_parent_death_signal(parent_pid: int) -> None:
    """Ask Linux to SIGTERM this process when its parent dies (prctl(2) ``PR_SET_PDEATHSIG``);
    no-op elsewhere. Exits at once if ``parent_pid`` already died before it took effect."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def local_process_is_gone(pid: int) -> bool:
    """True if no process ``pid`` exists on this host (``kill(pid, 0)``: ESRCH).

    False for this very process, and for a live process of another user (EPERM). A reused
    pid looks alive: callers then fall back to their time limit, the safe direction.
    """
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
