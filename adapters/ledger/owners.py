"""Who runs a run or holds a chunk's lease (``host:pid:random``), and whether that process
is gone."""

from __future__ import annotations

import os
import socket
import uuid

from adapters.processes import local_process_is_gone

__all__ = ["new_owner", "owner_is_dead"]


def new_owner() -> str:
    """Return a lease or run owner id unique to this process and run: ``host:pid:random``
    (taken when the run or lease starts, so a forked process names itself, not its parent)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_is_dead(owner: str | None) -> bool:
    """True if ``owner`` (``host:pid:random``) names a process of this host that is gone."""
    parts = (owner or "").rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname():
        return False
    # our own lease from an earlier run in this process is not "gone": it expires instead
    return parts[1].isdigit() and local_process_is_gone(int(parts[1]))
