"""Find processes by an environment entry (Linux ``/proc``): what a run left behind."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["processes_with_env", "wait_until_gone"]


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
