"""Ending the process at once: a second signal, or the CLI's watchdog after the Prefect API
went away, must not wait for cleanups that take seconds (Prefect's client retries, a server's
shutdown). Hooks registered here (stop the temporary server, mark a started run
``interrupted``) run first, best effort; then ``os._exit``.

One per process, ``STOP.exit`` (``embedline.shutdown``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["HardExit"]


class HardExit:
    """The hooks to run before the process ends at once, and that end. ``owner``: the object
    whose ``exit`` attribute this is; a pickled ``HardExit`` is the receiving process's own,
    as its owner is."""

    def __init__(self, owner: object) -> None:
        self._owner = owner
        self._hooks: list[Callable[[], None]] = []

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (self._owner, "exit"))

    def on_hard_exit(self, hook: Callable[[], None]) -> None:
        """Register ``hook`` to run before ``hard_exit`` ends the process."""
        self._hooks.append(hook)

    def remove_hard_exit_hook(self, hook: Callable[[], None]) -> None:
        """Unregister ``hook`` (no-op if it is not registered)."""
        if hook in self._hooks:
            self._hooks.remove(hook)

    def run_hard_exit_hooks(self) -> None:
        """Run the registered hooks (best effort): also when an interrupt ends the command
        before a run's own stop handling took over."""
        for hook in list(self._hooks):
            with contextlib.suppress(OSError):
                hook()

    def hard_exit(self, code: int) -> None:
        """Run the hooks (best effort), flush, and end the process now with ``code``."""
        self.run_hard_exit_hooks()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
