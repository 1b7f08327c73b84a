"""Is a process of this host gone? Used to reclaim leases and temp files of killed runs."""

from __future__ import annotations

import os

__all__ = ["local_process_is_gone"]


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
