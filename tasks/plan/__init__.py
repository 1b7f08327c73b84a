"""Plan: the input split into chunks (the ``plan-input`` task), which run a command works
on, and which chunks of the plan are already published.
"""

from __future__ import annotations

__all__: list[str] = []
