"""Publish: one Parquet object per chunk, created once under its content key, and the
run's vector length those objects must agree on.
"""

from __future__ import annotations

__all__: list[str] = []
