"""The reuse stage's plan (flow process): where each row's vector comes from, for a whole run.

Input: the text hashes planning spilled per row (``adapters.row_facts``: 64-bit prefix,
chunk, position; empty texts left out) for the chunks this run embeds. For each row, in
this order of preference (docs/design.md, "Reuse by content"):

1. an object of an earlier run that holds its text (the ledger's reuse index, by output,
   model and requested dimensions; the newest object wins, so a night's sources are one
   run's objects, not a mix of every run that held the text), taken by row position;
2. a request a failed attempt of this run kept (``_embedline/paid/{run_key}/``, listed once)
   for another chunk — a chunk's own kept requests are its own task's (``tasks.embed.paid``);
3. else the first chunk of this run with that text embeds it (the *owner*); a row in a later
   chunk waits for the owner's object (``tasks.reuse.chunk_side``), with the chunks in between that
   hold the text as *heirs*, in order (at most ``HEIRS``), should the owner fail.

The join runs bucket by bucket (``adapters.ledger.reuse_index.BUCKETS`` by the top bits of
the prefix): one bucket of the run's rows and of the index in memory at a time, sorted and
matched with numpy. Results go to two spills in the run's scratch directory: ``needs``
(which source row fills which chunk row, by source: ``tasks.reuse.gather`` reads each source
object once) and ``waits`` (in-run owners and heirs, by chunk). Memory does not grow with
the row count; time is a sort of each bucket.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adapters.ledger import Ledger
from adapters.ledger.reuse_index import BUCKETS
from adapters.row_facts import ROW_DTYPE
from adapters.scratch import Spill, hash_prefixes
from embedline.errors import EmbedlineError
from embedline.keys import dims_text, row_key
from embedline.models import ChunkSpec
from embedline.protocols import ObjectStore
from tasks.embed.paid import PAID_PREFIX, chunk_name
from tasks.publish.chunk_object import read_chunk_metadata

__all__ = ["HEIRS", "NEED_DTYPE", "WAIT_DTYPE", "JoinResult", "Source", "join_run", "refresh_index"]

logger = logging.getLogger("embedline")

#: Waiting chunks remembered per text, in order, to take over from a failed owner.
HEIRS = 16
#: Chunks per partition of the ``waits`` spill (read by the dispatcher a partition at a time).
WAIT_GROUP = 64
#: Sources per partition of the ``needs`` spill.
NEED_GROUP = 64
_NONE = np.iinfo(np.uint32).max  # "no heir" in WAIT_DTYPE["heirs"]
_INDEX_THREADS = 16
_INDEX_BATCH = 64  # objects indexed per ledger transaction

#: One row filled from a source: its text's hash prefix, source number, row there, chunk
#: index and row in the chunk.
NEED_DTYPE = np.dtype(
    [
        ("prefix", "<u8"),
        ("source", "<u4"),
        ("source_position", "<u4"),
        ("chunk", "<u4"),
        ("position", "<u4"),
    ]
)
#: One row whose text an earlier chunk of this run embeds: its owner and heirs (chunk indexes).
WAIT_DTYPE = np.dtype(
    [("chunk", "<u4"), ("position", "<u4"), ("owner", "<u4"), ("heirs", "<u4", (HEIRS,))]
)


@dataclass(frozen=True, slots=True)
class Source:
    """An object rows are copied from: a chunk object of an earlier run (``kept_by`` None)
    or a request kept by chunk ``kept_by`` of this run. ``rows`` (when known) sizes reads."""

    key: str
    kept_by: int | None = None
    rows: int = 0


@dataclass(slots=True)
class JoinResult:
    """What the join found: ``sources`` (numbered as in ``needs``), the ``needs`` and
    ``waits`` spills, and counts (rows) by kind."""

    sources: list[Source]
    needs: Spill
    waits: Spill
    nonempty: np.ndarray  # non-empty rows per chunk index (int64), for "fully reused"
    from_index: int = 0
    from_kept: int = 0
    waiting: int = 0
    owned: int = 0
    chunks_waiting: set[int] = field(default_factory=set)
    # with ``join_run(keep_owners=True)``: the owner row of each distinct text left to send,
    # as (chunk, position) records (a dry run counts their tokens: ``flows.estimate``)
    owners: list[np.ndarray] | None = None


# --------------------------------------------------------------------------- the index


def refresh_index(store: ObjectStore, ledger: Ledger) -> int:
    """Bring the ledger's reuse index for ``store`` in line with its ``chunks/``.

    Returns the number of objects newly indexed. Objects that are not embedline chunks are
    skipped (never indexed, never touched). Only the ``text_sha256`` column (and the first
    row's ``id``/``idempotency_key``) of each new object is read: ranged reads on S3.
    """
    listed = {i.key: i.modified for i in store.list("chunks/") if i.key.endswith(".parquet")}
    known = ledger.indexed_objects(store.uri)
    ledger.forget_objects(store.uri, sorted(known - listed.keys()))
    # oldest first: the index's ids then grow with age, as they do when runs index what
    # they publish, and the join prefers the newest copy of a text (ReuseIndex.reuse_objects)
    todo = sorted(listed.keys() - known, key=lambda k: (listed[k], k))
    # A window of _INDEX_BATCH objects at a time: Executor.map submits everything at once,
    # and answers that outrun the ledger's inserts would pile up (memory ~ the objects).
    with ThreadPoolExecutor(_INDEX_THREADS) as pool:
        for start in range(0, len(todo), _INDEX_BATCH):
            window = todo[start : start + _INDEX_BATCH]
            entries = pool.map(lambda k: _index_entry(store, k), window)
            ledger.index_objects(
                store.uri,
                [
                    (key, *entry)
                    for key, entry in zip(window, entries, strict=True)
                    if entry is not None
                ],
            )
    return len(todo)


def _index_entry(store: ObjectStore, key: str) -> tuple[str, str, pa.Array] | None:
    """(model, requested dimensions text, text hashes) of a chunk object, or None."""
    try:
        with store.open_read(key) as fh:
            parquet = pq.ParquetFile(fh)
            meta = read_chunk_metadata(parquet.schema_arrow)
            table = parquet.read(columns=["id", "text_sha256", "idempotency_key"])
    except (FileNotFoundError, ValueError, pa.ArrowException):
        return None
    if table.num_rows == 0:
        return meta.model, "", pa.array([], pa.string())
    first = table.slice(0, 1).to_pylist()[0]
    # The row key holds the *requested* dimensions ("" when unset): recover which one.
    for requested in (None, meta.dimensions):
        if (
            row_key(first["id"], first["text_sha256"], meta.model, requested)
            == first["idempotency_key"]
        ):
            return meta.model, dims_text(requested), table["text_sha256"]
    return None


# --------------------------------------------------------------------------- kept requests


def _kept_sources(
    store: ObjectStore, run_key: str, chunk_of: dict[str, int]
) -> tuple[list[Source], list[np.ndarray]]:
    """The requests chunks of this run kept (for chunks this run still embeds) and the hash
    prefixes of each one's rows. Unreadable ones are skipped with a warning."""
    prefix = f"{PAID_PREFIX}{run_key}/"
    try:
        keys = sorted(i.key for i in store.list(prefix) if i.key.endswith(".parquet"))
    except (EmbedlineError, OSError) as exc:
        logger.warning("could not list the paid requests under %s: %s", prefix, type(exc).__name__)
        return [], []
    sources, hashes = [], []
    for key in keys:
        owner = chunk_of.get(key[len(prefix) :].split("/")[0])
        if owner is None:
            continue
        try:
            with store.open_read(key) as fh:
                column = pq.read_table(fh, columns=["text_sha256"])["text_sha256"]
        except FileNotFoundError:
            continue
        except (EmbedlineError, OSError, ValueError, KeyError, pa.ArrowException) as exc:
            logger.warning("skipping an unreadable paid request %s: %s", key, type(exc).__name__)
            continue
        sources.append(Source(key, kept_by=owner, rows=len(column)))
        hashes.append(hash_prefixes(column))  # "" (no text hash kept): zeros, matching none
    return sources, hashes


# --------------------------------------------------------------------------- the join


def join_run(
    *,
    directory: Path,
    rows: Spill,
    todo: Sequence[ChunkSpec],
    chunks_total: int,
    ledger: Ledger,
    store: ObjectStore,
    model: str,
    dimensions: int | None,
    reuse: bool,
    run_key: str,
    keep_owners: bool = False,
) -> JoinResult:
    """Decide, for every non-empty row of the ``todo`` chunks, where its vector comes from
    (module docstring), writing the ``needs`` and ``waits`` spills under ``directory``.
    ``rows`` is planning's spill (``ROW_DTYPE``, by bucket);
    ``chunks_total`` the plan's chunk count. With ``reuse`` False the index is not used
    (in-run deduplication and kept requests still are). ``keep_owners``: also list the
    owner row of every text left to send (``JoinResult.owners``).
    """
    in_todo = np.zeros(chunks_total, dtype=bool)
    in_todo[[s.index for s in todo]] = True
    objects = (
        ledger.reuse_objects(store.uri, model=model, dimensions=dims_text(dimensions))
        if reuse
        else {}
    )
    sources = [Source(key) for key in objects.values()]
    source_of = np.full(max(objects, default=0) + 1, -1, dtype=np.int64)  # object id -> number
    source_of[list(objects)] = np.arange(len(objects))
    kept, kept_hashes = _kept_sources(
        store, run_key, {chunk_name(s.object_key): s.index for s in todo}
    )
    first_kept = len(sources)
    sources += kept
    kept_entries = _kept_buckets(kept_hashes, first_kept)
    result = JoinResult(
        sources,
        Spill(directory / "needs", NEED_DTYPE),
        Spill(directory / "waits", WAIT_DTYPE),
        np.zeros(chunks_total, dtype=np.int64),
        owners=[] if keep_owners else None,
    )
    owner_of = np.array(
        [s.kept_by if s.kept_by is not None and not keep_owners else -1 for s in sources],
        dtype=np.int64,
    )  # a dry run (keep_owners) counts a chunk's own kept requests too: its task takes them
    for bucket in range(BUCKETS):
        run = rows.read(bucket)
        run = run[in_todo[run["chunk"]]]
        if not len(run):
            continue
        np.add.at(result.nonempty, run["chunk"].astype(np.int64), 1)
        run = run[np.lexsort((run["position"], run["chunk"], run["prefix"]))]
        left = np.ones(len(run), dtype=bool)
        if objects:
            prefixes, oids, positions = ledger.bucket(bucket, list(objects))
            numbers = source_of[oids]
            result.from_index += _take(
                result.needs, run, left, prefixes, numbers, positions, owner_of
            )
        entries = kept_entries[bucket]
        if entries is not None:
            result.from_kept += _take(result.needs, run, left, *entries, owner_of)
        _in_run(result, run[left])
    result.needs.flush()
    result.waits.flush()
    return result


def _kept_buckets(
    hashes: list[np.ndarray], first: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """The kept requests' entries split by bucket: (prefixes, source numbers, positions)."""
    out: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * BUCKETS
    if not hashes:
        return out
    prefixes = np.concatenate(hashes)
    numbers = np.repeat(np.arange(first, first + len(hashes)), [len(h) for h in hashes])
    positions = np.concatenate([np.arange(len(h)) for h in hashes])
    buckets = (prefixes >> np.uint64(58)).astype(np.int64)
    for bucket in np.unique(buckets):
        at = buckets == bucket
        out[int(bucket)] = (prefixes[at], numbers[at], positions[at])
    return out


def _take(
    needs: Spill,
    run: np.ndarray,
    left: np.ndarray,
    prefixes: np.ndarray,
    numbers: np.ndarray,
    positions: np.ndarray,
    owner_of: np.ndarray,
) -> int:
    """Match the rows still ``left`` against one set of source entries (the first source
    per prefix: lowest number, then position), add their needs, clear them from ``left``.
    A source kept by the row's own chunk is not used (that chunk's task takes it)."""
    if not len(prefixes) or not left.any():
        return 0
    if len(prefixes) > len(run):  # a small run against a large index: sort what it can use
        wanted = np.unique(run["prefix"][left])
        usable = wanted[np.minimum(np.searchsorted(wanted, prefixes), len(wanted) - 1)] == prefixes
        prefixes, numbers, positions = prefixes[usable], numbers[usable], positions[usable]
        if not len(prefixes):
            return 0
    order = np.lexsort((positions, numbers, prefixes))
    prefixes, numbers, positions = prefixes[order], numbers[order], positions[order]
    first = np.r_[True, prefixes[1:] != prefixes[:-1]]
    prefixes, numbers, positions = prefixes[first], numbers[first], positions[first]
    at = np.minimum(np.searchsorted(prefixes, run["prefix"]), len(prefixes) - 1)
    hit = left & (prefixes[at] == run["prefix"])
    hit &= owner_of[numbers[at]] != run["chunk"].astype(np.int64)
    if not hit.any():
        return 0
    need = np.empty(int(hit.sum()), dtype=NEED_DTYPE)
    need["prefix"] = run["prefix"][hit]
    need["source"] = numbers[at[hit]]
    need["source_position"] = positions[at[hit]]
    need["chunk"] = run["chunk"][hit]
    need["position"] = run["position"][hit]
    needs.add(need, (need["source"] // NEED_GROUP).astype(np.int64))
    left &= ~hit
    return len(need)


def _in_run(result: JoinResult, run: np.ndarray) -> None:
    """Rows no source holds: the first chunk with each text owns it; rows of other chunks
    wait for it (``WAIT_DTYPE``). ``run`` is sorted by (prefix, chunk, position)."""
    if not len(run):
        return
    prefixes, chunks = run["prefix"], run["chunk"]
    starts = np.flatnonzero(np.r_[True, prefixes[1:] != prefixes[:-1]])
    ends = np.r_[starts[1:], len(run)]
    result.owned += len(starts)
    if result.owners is not None:
        result.owners.append(np.stack([chunks[starts], run["position"][starts]], axis=1))
    shared = starts[chunks[starts] != chunks[ends - 1]]  # texts in more than one chunk
    waits = []
    for start in shared:
        stop = ends[np.searchsorted(starts, start)]
        group = chunks[start:stop]
        owner = int(group[0])
        distinct = list(dict.fromkeys(int(c) for c in group))  # in chunk order
        for at in range(start, stop):
            chunk = int(chunks[at])
            if chunk == owner:
                continue  # the owner itself, or a copy inside the owner (its task copies it)
            before = distinct[1 : distinct.index(chunk)][:HEIRS]
            waits.append(
                (chunk, int(run["position"][at]), owner, before + [_NONE] * (HEIRS - len(before)))
            )
    if waits:
        records = np.array(waits, dtype=WAIT_DTYPE)
        result.waits.add(records, (records["chunk"] // WAIT_GROUP).astype(np.int64))
        result.waiting += len(records)
        result.chunks_waiting.update(int(c) for c in records["chunk"])


def read_waits(waits: Spill, chunk: int, cache: dict[int, np.ndarray]) -> np.ndarray:
    """The ``waits`` records of ``chunk`` (``WAIT_DTYPE``, sorted by position); ``cache``
    keeps the last partition read (the dispatcher asks chunk by chunk, in order)."""
    group = chunk // WAIT_GROUP
    if group not in cache:
        cache.clear()
        cache[group] = waits.read(group)
    records = cache[group]
    mine: np.ndarray = records[records["chunk"] == chunk]
    return mine[np.argsort(mine["position"], kind="stable")]


assert ROW_DTYPE.names == ("prefix", "chunk", "position")  # planning's spill, read above
