"""What every sink store shares: the metadata embedline writes beside a table it creates,
and the check that refuses to mix vectors of another model or length in one table.

The stores (``sink_lancedb``, ``sink_pgvector``) import this module; ``adapters.sinks``
(URI parsing and the factory) imports the stores lazily: no import cycle.
"""

from __future__ import annotations

import json
from typing import Any

from embedline.errors import FatalError
from embedline.protocols import SinkTable

__all__ = ["SINK_FORMAT", "check_compatible", "sink_metadata", "sink_table_from_metadata"]

SINK_FORMAT = "embedline.sink.v1"


def sink_metadata(*, embedder: str, model: str, dimensions: int) -> str:
    """The JSON a sink table carries about its vectors (a LanceDB schema metadata value, a
    PostgreSQL table comment)."""
    return json.dumps({"format": SINK_FORMAT, "embedder": embedder, "model": model,
                       "dimensions": dimensions}, sort_keys=True)  # fmt: skip


def sink_table_from_metadata(text: str | bytes | None, *, dimensions: int, rows: int) -> SinkTable:
    """Parse ``sink_metadata`` JSON (None or foreign text: a table embedline did not create)."""
    try:
        meta: Any = json.loads(text) if text else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != SINK_FORMAT:
        return SinkTable(None, None, dimensions, rows)
    return SinkTable(str(meta.get("embedder")), str(meta.get("model")), dimensions, rows)


def check_compatible(found: SinkTable, *, where: str, model: str, dimensions: int) -> None:
    """Refuse to mix vectors of another length or model in one table.

    :raises FatalError: naming both the table's and the run's model and dimensions.
    """
    if found.dimensions == dimensions and found.model in (None, model):
        return
    raise FatalError(
        f"{where} holds {found.dimensions}-dimension vectors of model {found.model or 'unknown'}"
        f", but this run has {dimensions}-dimension vectors of model {model}: load into "
        "another table (?table=NAME) or drop that one"
    )
