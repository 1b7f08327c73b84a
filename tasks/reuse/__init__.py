"""Reuse: rows whose vector an earlier run's object, or a request this run kept, already
holds. The flow process plans where each row's vector comes from and copies the vectors
once per source object; each chunk takes its copies and waits for in-run owners.
"""

from __future__ import annotations

__all__: list[str] = []
