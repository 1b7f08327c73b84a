"""Progress events from the flow to whoever shows them (the CLI's progress bar).

The flow calls ``notify``; a listener registered with ``listen`` receives each event. With no
listener (a deployment run), events cost one function call. Events carry counts only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Progress", "listen", "notify"]


@dataclass(frozen=True, slots=True)
class Progress:
    """Run progress: rows and chunks done out of the totals; ``skipped`` were published before."""

    rows_total: int
    chunks_total: int
    rows_done: int
    chunks_done: int
    rows_skipped: int
    dead_letters: int
    chunks_failed: int


_listener: Callable[[Progress], None] | None = None


def listen(callback: Callable[[Progress], None] | None) -> None:
    """Register ``callback`` for progress events (None removes it)."""
    global _listener
    _listener = callback


def notify(event: Progress) -> None:
    """Send ``event`` to the registered listener, if any."""
    if _listener is not None:
        _listener(event)
