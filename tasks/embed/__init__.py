"""Embed: a chunk's rows through the embedding API (the chunk task): batching, bisection
of rejected rows, the requests kept once paid for, and what a chunk's failure means.
"""

from __future__ import annotations

__all__: list[str] = []
