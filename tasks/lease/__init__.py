"""Leases: objects in the output store that tell gc what a run or a load in progress
needs.
"""

from __future__ import annotations

__all__: list[str] = []
