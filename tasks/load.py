"""The load-chunk task: upsert one published chunk object into a vector-store sink.

It takes a small frozen ``LoadJob`` plus the manifest's entry for the chunk, reads the
object from the output root (checked against the manifest's SHA-256), and upserts its rows
by id in one sink transaction. It never touches the ledger: the flow process records each
loaded chunk after the task returns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from adapters.sinks import open_sink
from embedline.models import ManifestChunk
from embedline.protocols import VectorSink
from tasks.chunk import store_for
from tasks.outcome import retry_condition
from tasks.read import chunk_table

__all__ = ["LoadJob", "load_chunk", "rows_to_load", "sink_for"]


@dataclass(frozen=True, slots=True)
class LoadJob:
    """What every chunk load of one run into one sink shares (no secrets: the sink URI has
    no password). ``upsert_ids`` is None in ``replace`` mode (every row is upserted); in
    ``changes`` mode, the change set's added and changed ids (the only rows upserted)."""

    output: str
    sink: str
    run_key: str
    mode: str
    upsert_ids: frozenset[str] | None = None


@functools.lru_cache(maxsize=8)
def sink_for(uri: str) -> VectorSink:
    """Return this process's sink for ``uri`` (one set of connections per URI)."""
    return open_sink(uri)


def rows_to_load(table: pa.Table, upsert_ids: frozenset[str] | None) -> pa.Table:
    """The rows of a chunk to upsert: all of them, or those whose id is in ``upsert_ids``."""
    if upsert_ids is None:
        return table
    return table.filter(pc.is_in(table.column("id"), pa.array(sorted(upsert_ids),
                                                               type=pa.string())))  # fmt: skip


@task(
    name="load-chunk",
    task_run_name="load-chunk-{chunk.index:04d}",
    cache_policy=NO_CACHE,
    retry_condition_fn=retry_condition,
)
def load_chunk(chunk: ManifestChunk, job: LoadJob, ids: frozenset[str] | None = None) -> int:
    """Upsert chunk ``chunk`` of run ``job.run_key`` into ``job.sink`` (only the rows whose
    id is in ``ids``, when given: those the sink lacks); return rows written.

    :raises ConflictError: the object differs from the manifest.
    :raises RetryableError: the sink was unreachable (Prefect may retry the task).
    :raises FatalError: the sink refused the write (rights, missing extension).
    """
    logger = get_run_logger()
    table = rows_to_load(chunk_table(store_for(job.output), chunk.to_dict()),
                         job.upsert_ids if ids is None else ids)  # fmt: skip
    written = sink_for(job.sink).upsert(table, run_key=job.run_key)
    logger.info("chunk %d: %d of %d rows upserted into %s", chunk.index, written, chunk.rows,
                sink_for(job.sink).identity)  # fmt: skip
    return written
