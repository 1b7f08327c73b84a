"""Old import path of the sinks' shared metadata helpers; their home is ``adapters.sinks.base``."""

from adapters.sinks.base import SINK_FORMAT, check_compatible, sink_metadata, sink_table_from_metadata

__all__ = ["SINK_FORMAT", "check_compatible", "sink_metadata", "sink_table_from_metadata"]
