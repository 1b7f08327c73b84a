"""The hooks to run before the process ends at once: a second signal, or the CLI's watchdog
after the Prefect API went away, must not wait for cleanups that take seconds (Prefect's
client retries, a server's shutdown). Hooks registered here (stop the temporary server, mark
a started run ``interrupted``) run first, best effort; ``flows.hard_exit`` then ends the
process.

One per process, ``STOP.exit`` (``embedline.shutdown``). No exit here: the registry only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["HardExitHooks"]


class HardExitHooks:
    """The hooks to run before the process ends at once. ``owner``: the object whose
    ``exit`` attribute this is; a pickled ``HardExitHooks`` is the receiving process's own,
    as its owner is."""

    def __init__(self, owner: object) -> None:
        self._owner = owner
        self._hooks: list[Callable[[], None]] = []

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (self._owner, "exit"))

    def on_hard_exit(self, hook: Callable[[], None]) -> None:
        """Register ``hook`` to run before ``flows.hard_exit.hard_exit`` ends the process."""
        self._hooks.append(hook)

    def remove_hard_exit_hook(self, hook: Callable[[], None]) -> None:
        """Unregister ``hook`` (no-op if it is not registered)."""
        if hook in self._hooks:
            self._hooks.remove(hook)

    def run_hard_exit_hooks(self) -> None:
        """Run the registered hooks (best effort): before a hard exit, and also when an
        interrupt ends the command before a run's own stop handling took over."""
        for hook in list(self._hooks):
            with contextlib.suppress(OSError):
                hook()
