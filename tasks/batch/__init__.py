"""Batch API: a chunk's requests as batch input files and parts, the provider calls
recorded in the ledger, and the answers as the chunk task's embedding client.
"""

from __future__ import annotations

__all__: list[str] = []
