"""Old import path of the LanceDB sink; its home is ``adapters.sinks.lancedb``."""

from adapters.sinks.lancedb import DEFAULT_KEEP_VERSIONS_S, LanceDBSink

__all__ = ["DEFAULT_KEEP_VERSIONS_S", "LanceDBSink"]
