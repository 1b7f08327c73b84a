"""Find processes by an environment entry (Linux ``/proc``): what a run left behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["die_with_parent", "processes_with_env", "wait_until_gone"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """``preexec_fn`` for a test's helper process: Linux sends it SIGTERM when the test
    process dies, even of SIGKILL (prctl(2) ``PR_SET_PDEATHSIG``), so a killed pytest
    leaves no server behind. A no-op where prctl is missing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(0)


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of this user's live processes whose environment holds ``name=value``."""
    entry_bytes = f"{name}={value}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if entry_bytes in environ and state != "Z":  # a zombie is dead, awaiting its reaper
            pids.append(int(entry.name))
    return pids


def wait_until_gone(name: str, value: str, timeout_s: float) -> list[int]:
    """Poll until no process has ``name=value`` in its environment; return the survivors
    (empty when all are gone) after at most ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = processes_with_env(name, value)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)
