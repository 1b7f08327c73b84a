"""Old import path of the pgvector sink; its home is ``adapters.sinks.pgvector``."""

from adapters.sinks.pgvector import HNSW_MAX_DIMENSIONS, PgVectorSink

__all__ = ["HNSW_MAX_DIMENSIONS", "PgVectorSink"]
