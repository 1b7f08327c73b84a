"""The ledger's rows as frozen records (``runs``, ``chunks``, ``objects``, ``sink_loads``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChunkRecord", "ObjectRecord", "RunRecord", "SinkLoadRecord"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A ``runs`` row (counts in rows/chunks; times UTC ISO-8601)."""

    run_key: str
    input_name: str
    input_rows: int
    output_uri: str
    status: str
    chunks_total: int
    rows_published: int
    rows_failed: int
    manifest_uri: str | None
    updated_at: str


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """A ``chunks`` row; ``lease_expires`` is a Unix time in seconds."""

    idx: int
    chunk_key: str
    state: str
    attempts: int
    last_error: str | None
    lease_owner: str | None
    lease_expires: float | None


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """An ``objects`` row: a published chunk object (``rows`` in the object)."""

    object_uri: str
    chunk_key: str
    sha256: str
    rows: int
    dead_letters: int


@dataclass(frozen=True, slots=True)
class SinkLoadRecord:
    """A ``sink_loads`` row: the load of one run into one sink (rows; UTC ISO-8601 time)."""

    sink: str
    run_key: str
    state: str
    mode: str
    rows_loaded: int
    rows_deleted: int
    updated_at: str
