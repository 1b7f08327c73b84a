"""Adapters to the outside world: CSV and input sources, embedding clients, object stores, the
ledger. They never import Prefect; they log to ``embedline.*`` loggers."""

from adapters.csv_source import plan_csv, read_chunk
from adapters.embeddings import LocalEmbedder, OpenAIEmbedder, build_embedder
from adapters.input_source import open_input
from adapters.ledger import Ledger
from adapters.object_store import LocalDirStore, S3Store, open_store

__all__ = [
    "Ledger",
    "LocalDirStore",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "S3Store",
    "build_embedder",
    "open_input",
    "open_store",
    "plan_csv",
    "read_chunk",
]
