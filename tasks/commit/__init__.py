"""Commit: a run's change set against the run before it, then its manifest (the commit
point), written once by conditional create.
"""

from __future__ import annotations

__all__: list[str] = []
