"""The load stage's tasks: ``load-chunk`` upserts one published chunk object into a
vector-store sink; ``build-index`` builds the sink's index after the last chunk.

It takes a small frozen ``LoadJob`` plus the manifest's entry for the chunk, reads the
object from the output root (checked against the manifest's SHA-256), and upserts its rows
by id in one sink transaction. It never touches the ledger: the flow process records each
loaded chunk after the task returns.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from adapters.sinks import open_sink
from embedline.models import LoadDeadLetter, ManifestChunk, shown_id
from embedline.protocols import VectorSink
from tasks.embed.failures import retry_condition
from tasks.embed.task import store_for
from tasks.load.read_run import chunk_table

__all__ = [
    "LoadJob",
    "LoadedChunk",
    "build_index",
    "load_chunk",
    "release_sink",
    "rows_to_load",
    "sink_for",
]


@dataclass(frozen=True, slots=True)
class LoadJob:
    """What every chunk load of one run into one sink shares (no secrets: the sink URI has
    no password). Which rows of a chunk to upsert is the plan's (``load_chunk``'s ``ids``),
    decided by what the sink holds."""

    output: str
    sink: str
    run_key: str
    mode: str
    columns: tuple[str, ...] = ()  # the run's kept columns and text (names only)


@dataclass(frozen=True, slots=True)
class LoadedChunk:
    """What ``load_chunk`` did: ``rows`` upserted; ``dead_letters`` the rows the sink
    refuses for good (left out; the chunk's other rows are loaded)."""

    rows: int
    dead_letters: tuple[LoadDeadLetter, ...] = ()


_SINKS: OrderedDict[str, VectorSink] = OrderedDict()
_SINKS_LOCK = threading.Lock()
_MAX_SINKS = 8


def sink_for(uri: str) -> VectorSink:
    """Return this process's sink for ``uri``: one per sink *identity*, so every URI naming
    the same table (``./db/t.lance``, ``lancedb://db?table=t``, the identity itself) shares
    one set of connections and one LanceDB table handle (two handles on one table raced
    each other's commits: "Retryable commit conflict … preempted"). Opening is lazy: no
    connection is made here.

    :raises InputError: see ``adapters.sinks.validate_sink_uri``.
    """
    candidate = open_sink(uri)
    with _SINKS_LOCK:
        sink = _SINKS.get(candidate.identity)
        if sink is None:
            sink = _SINKS[candidate.identity] = candidate
            while len(_SINKS) > _MAX_SINKS:
                _SINKS.popitem(last=False)
        _SINKS.move_to_end(candidate.identity)
        return sink


def release_sink(uri: str) -> None:
    """Close this process's sink for ``uri`` (``sink_for``) and forget it: a load that
    ended lets go of its connections, and of a local-mode store's lock (Qdrant's
    ``qdrant+local://`` directory admits one client: a served deployment's process, which
    outlives its loads, kept every other process out of it). The next ``sink_for`` opens a
    new one."""
    identity = open_sink(uri).identity
    with _SINKS_LOCK:
        sink = _SINKS.pop(identity, None)
    if sink is not None:
        sink.close()


def rows_to_load(table: pa.Table, upsert_ids: frozenset[str] | None) -> pa.Table:
    """The rows of a chunk to upsert: all of them, or those whose id is in ``upsert_ids``."""
    if upsert_ids is None:
        return table
    return table.filter(
        pc.is_in(table.column("id"), pa.array(sorted(upsert_ids), type=pa.string()))
    )


@task(
    name="load-chunk",
    task_run_name="load-chunk-{chunk.index:04d}",
    cache_policy=NO_CACHE,
    retry_condition_fn=retry_condition,
)
def load_chunk(
    chunk: ManifestChunk, job: LoadJob, ids: frozenset[str] | None = None
) -> LoadedChunk:
    """Upsert chunk ``chunk`` of run ``job.run_key`` into ``job.sink`` (only the rows whose
    id is in ``ids``, when given: those the sink lacks); return rows written and the rows
    the sink refused for good (load dead letters).

    :raises ConflictError: the object differs from the manifest.
    :raises RetryableError: the sink was unreachable (Prefect may retry the task).
    :raises FatalError: the sink refused the write (rights, missing extension, a table of
        another shape).
    """
    logger = get_run_logger()
    sink = sink_for(job.sink)
    table = rows_to_load(chunk_table(store_for(job.output), chunk.to_dict(), job.columns), ids)
    result = sink.upsert(table, run_key=job.run_key)
    dead = tuple(
        LoadDeadLetter(chunk.index, row_id, reason, state, message)
        for _, row_id, reason, state, message in result.refused
    )
    logger.info(
        "chunk %d: %d of %d rows upserted into %s",
        chunk.index,
        result.rows,
        chunk.rows,
        sink.identity,
    )
    for d in dead:
        logger.warning(
            "chunk %d: row id %s refused by the sink for good (%s: %s)",
            chunk.index,
            shown_id(d.id),
            d.reason,
            d.message,
        )
    return LoadedChunk(result.rows, dead)


@task(name="build-index", task_run_name="build-index", cache_policy=NO_CACHE)
def build_index(sink: str, keep_versions_s: float | None = None) -> str:
    """Build (or refresh) the index of ``sink`` (a sink URI or identity) after a load: the
    stage a long HNSW build is seen as in the Prefect UI. Returns what was done, in a few
    words (``VectorSink.finalize``; ``keep_versions_s``: LanceDB's version retention).

    :raises RetryableError: the server was unreachable, or cancelled the build (a timeout).
    :raises FatalError: the server refused it.
    """
    get_run_logger().info("building the index of %s", sink)
    return sink_for(sink).finalize(keep_versions_s=keep_versions_s)
