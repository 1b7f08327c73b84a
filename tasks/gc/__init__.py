"""Retention: what no kept run needs, deleted from an output root (``embedline gc``)."""

from __future__ import annotations

__all__: list[str] = []
