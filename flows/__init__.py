"""The ``embed-csv`` Prefect flow."""

from flows.embed_csv import embed_csv

__all__ = ["embed_csv"]
