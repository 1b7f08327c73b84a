"""Vector-store sinks (docs/reference/sinks.md), one module per store over one interface, as dlt's
``destinations/impl/*``:

- ``base``: the interface (``VectorSink``) and what every store shares (table metadata, the
  model/length check, the batch's vector matrix);
- ``lancedb``, ``pgvector`` (with ``pg_errors``, its refusal classes), ``qdrant``: the
  stores, each importing ``base`` only;
- ``factory``: the URI forms and ``open_sink``, importing a store only when it opens one.

A new store is a module here plus one ``SinkKind`` in ``factory.KINDS``.
"""

from adapters.sinks.base import (
    DEFAULT_TABLE,
    SINK_FORMAT,
    check_compatible,
    sink_metadata,
    sink_table_from_metadata,
)
from adapters.sinks.factory import is_sink_uri, open_sink, server_refusal, validate_sink_uri

__all__ = [
    "DEFAULT_TABLE",
    "SINK_FORMAT",
    "check_compatible",
    "is_sink_uri",
    "open_sink",
    "server_refusal",
    "sink_metadata",
    "sink_table_from_metadata",
    "validate_sink_uri",
]
