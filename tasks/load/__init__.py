"""Load: a committed run into a vector-store sink (the ``load-chunk`` task), what the sink
holds against what the run contains, model cutover, and reading a run back.
"""

from __future__ import annotations

__all__: list[str] = []
