"""Change sets: what a committed run added, changed and removed relative to the run before it.

``changes/{run_key}.parquet`` (docs/reference/output-layout.md, a contract) has columns ``id``
(string), ``change`` (string: ``added``, ``changed`` or ``removed``), ``text_sha256`` (string: the
new text's hash for added/changed ids, the old one for removed ids) and ``text_changed`` (bool: True
when the text changed, False when only kept columns did, null for added and removed),
sorted by id. Unchanged ids are only counted. An id whose text is the same but whose kept
values differ is ``changed`` (its vector is reused, not sent again: docs/design.md, "Reuse by
content"). The base is ``latest_manifest`` over the same output root and dataset (columns, template,
kept columns, model, dimensions) at the moment of committing (named in the manifest as
``changes.base_run_key``), so a consumer that applied exactly that run can apply this one.

Only ids with a vector count: an id that became a dead letter is ``removed``.

Memory is bounded whatever the row count: chunk objects both runs list
are skipped (same content key, same rows); of the others only the ``id`` and
``text_sha256`` columns (and the kept columns' hash) are read (ranged reads on S3), sorted
on disk in a scratch directory the caller owns and merged in id-aligned blocks
(``tasks.commit.sorted_spills``); each block is classified by one sort and vectorized comparisons,
and the change rows are written, a row group at a time, to a local Parquet file that the
store streams (``put_file_if_absent``). With the default ``SortLimits`` about 36 MiB of
Arrow memory is used at most, and the scratch directory holds about 80 bytes per row of
each side that is read (1.6 GB for a shuffled night of 10 million rows), plus the change set.
"""

from __future__ import annotations

import builtins
import json
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from adapters.sinks.base import KEPT_HASH, kept_hashes
from embedline.errors import ConflictError
from embedline.protocols import ObjectStore
from tasks.commit.manifest import live_rows
from tasks.commit.sorted_spills import SortLimits, SortStats, merge_blocks, reduce_runs, write_runs

__all__ = [
    "CHANGES_FORMAT",
    "CHANGES_SCHEMA",
    "ChangeCounts",
    "changes_object_key",
    "diff_blocks",
    "read_entry_keys",
    "read_keys",
    "write_change_table",
    "write_changes",
]

CHANGES_FORMAT = "embedline.changes.v1"
_META_KEY = b"embedline"
_KEY_COLUMNS = ["id", "text_sha256"]
CHANGES_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("change", pa.string()),
        ("text_sha256", pa.string()),
        ("text_changed", pa.bool_()),
    ]
)
_CONTENT_TYPE = "application/vnd.apache.parquet"
_READ_AHEAD = 8  # chunk objects whose key columns are read at once, ahead of the sort


def changes_object_key(run_key: str) -> str:
    """Return the change set's object key, ``changes/{run_key}.parquet``."""
    return f"changes/{run_key}.parquet"


@dataclass(frozen=True, slots=True)
class ChangeCounts:
    """Counts of ids (rows with a vector) by change, and what the change set was taken from.

    ``base_run_key`` is None for the first committed run (every id is ``added``).
    """

    object: str
    sha256: str
    base_run_key: str | None
    added: int
    changed: int
    removed: int
    unchanged: int

    def to_dict(self) -> dict[str, builtins.object]:
        """Return the counts as the manifest's ``changes`` entry."""
        return asdict(self)


def read_keys(store: ObjectStore, object_key: str, kept_columns: Sequence[str] = ()) -> pa.Table:
    """Return the ``id`` and ``text_sha256`` columns of a chunk object (strings), and with
    ``kept_columns`` also ``kept_sha256`` (``adapters.sinks.base.kept_hashes``).

    Reads only those columns' pages (and the footer), never the vectors.

    :raises FileNotFoundError: the object does not exist.
    """
    with store.open_read(object_key) as fh:
        parquet = pq.ParquetFile(fh)
        if not kept_columns:
            return parquet.read(columns=_KEY_COLUMNS)
        present = [c for c in kept_columns if c in parquet.schema_arrow.names]
        table = parquet.read(columns=_KEY_COLUMNS + present)
    return table.select(_KEY_COLUMNS).append_column(KEPT_HASH, kept_hashes(table, kept_columns))


def read_entry_keys(
    store: ObjectStore, entry: dict[str, Any], kept_columns: Sequence[str] = ()
) -> pa.Table:
    """``read_keys`` of a manifest entry's object, without the rows the entry drops
    (``tasks.commit.manifest.live_rows``).

    :raises FileNotFoundError: the object does not exist.
    :raises ConflictError: the object does not hold the rows its entry says.
    """
    table = read_keys(store, str(entry["object"]), kept_columns)
    return live_rows(table, entry, uri=store.uri_for(str(entry["object"])))


def _listed(entry: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """What a manifest entry takes: its object and the ids it drops from it."""
    return str(entry["object"]), tuple(sorted(str(i) for i in entry.get("drop_ids") or ()))


def _key_schema(kept_columns: Sequence[str]) -> pa.Schema:
    """The key tables' schema: ``id``, ``text_sha256`` and, with kept columns, their hash."""
    names = _KEY_COLUMNS + ([KEPT_HASH] if kept_columns else [])
    return pa.schema([(c, pa.string()) for c in names])


def _key_tables(
    store: ObjectStore, chunks: Sequence[dict[str, Any]], kept_columns: Sequence[str]
) -> Iterator[pa.Table]:
    """``read_keys`` of each chunk with rows (cast to ``_key_schema``), in order, reading
    ``_READ_AHEAD`` objects at once (ranged reads on S3 wait on the network, not the CPU)."""
    schema = _key_schema(kept_columns)
    entries = [c for c in chunks if int(c["rows"])]
    with ThreadPoolExecutor(_READ_AHEAD) as pool:
        ahead: deque[Future[pa.Table]] = deque()
        try:
            for entry in entries:
                ahead.append(pool.submit(read_entry_keys, store, entry, kept_columns))
                if len(ahead) >= _READ_AHEAD:
                    yield ahead.popleft().result().cast(schema)
            while ahead:
                yield ahead.popleft().result().cast(schema)
        finally:
            for future in ahead:
                future.cancel()


def diff_blocks(
    store: ObjectStore,
    current: Sequence[dict[str, Any]],
    base: Sequence[dict[str, Any]],
    kept_columns: Sequence[str] = (),
    *,
    scratch_dir: Path,
    limits: SortLimits = SortLimits(),
    stats: SortStats | None = None,
) -> Iterator[pa.Table]:
    """Yield the change rows (``id``, ``change``, ``text_sha256``, ``text_changed``) in
    blocks, every row in id order across them (UTF-8 byte order); with ``kept_columns`` an
    id whose kept values differ is ``changed`` too. Blocks have at least one row.

    ``current`` and ``base`` are manifest ``chunks`` entries (``object``, ``rows``). Ids are
    unique within each run (the planner refuses duplicates), so a chunk object both runs
    list, dropping the same ids from it, holds the same ids with the same texts (and kept
    values: they are in its key) on both sides and is never read. The others' key columns
    are sorted on disk under ``scratch_dir`` (``tasks.commit.sorted_spills``: about 80 bytes
    a row, each side) and merged, holding ``limits`` rows at most (counted in ``stats``),
    whatever the row count.

    :raises FileNotFoundError: a chunk object is missing.
    :raises OSError: ``scratch_dir`` is full or not writable.
    """
    stats = SortStats() if stats is None else stats
    shared = {_listed(c) for c in current} & {_listed(c) for c in base}
    schema = _key_schema(kept_columns)
    sides = [
        write_runs(
            _key_tables(store, [c for c in chunks if _listed(c) not in shared], kept_columns),
            scratch_dir,
            name=name,
            limits=limits,
            stats=stats,
        )
        for name, chunks in (("new", current), ("old", base))
    ]
    sides = reduce_runs(sides, schema, scratch_dir, limits=limits, stats=stats)
    for new, old in merge_blocks(sides, schema, limits=limits, stats=stats):
        changes = _classify(new, old, kept_columns)
        if changes.num_rows:
            yield changes


def _classify(new: pa.Table, old: pa.Table, kept_columns: Sequence[str]) -> pa.Table:
    """The change rows, sorted by id, of one block: ``new`` and ``old`` hold every row of
    each side whose id is in the block's range (``_key_schema``; not both empty).

    Both sides are sorted together by (id, side): an id on both sides is then two adjacent
    rows, its new one first (ids are unique within a side). One sort and a few vectorized
    comparisons of each row with the next; no hash join (Arrow's held about 4 times a
    block and kept its memory). Hashes are never null (every row has a vector).
    """
    both = pa.concat_tables(
        [
            new.append_column("old", pa.repeat(pa.scalar(False), new.num_rows)),
            old.append_column("old", pa.repeat(pa.scalar(True), old.num_rows)),
        ]
    ).combine_chunks()
    rows = both.take(pc.sort_indices(both, sort_keys=[("id", "ascending"), ("old", "ascending")]))
    del both
    ids, hashes, is_old = (rows.column(c).combine_chunks() for c in ("id", "text_sha256", "old"))
    pair = _with_next(ids, pc.equal)  # row i is an id's new row, row i + 1 its old one
    after_pair = pa.concat_arrays([pa.array([False]), pair.slice(0, len(pair) - 1)])
    single = pc.invert(pc.or_(pair, after_pair))  # the id is on one side only
    text_differs = _with_next(hashes, pc.not_equal)
    differs = text_differs
    if kept_columns:
        differs = pc.or_(differs, _with_next(rows.column(KEPT_HASH).combine_chunks(), pc.not_equal))
    change = pc.if_else(single, pc.if_else(is_old, "removed", "added"), "changed")
    text_changed = pc.if_else(single, pa.scalar(None, pa.bool_()), text_differs)
    table = pa.Table.from_arrays([ids, change, hashes, text_changed], schema=CHANGES_SCHEMA)
    return table.filter(pc.or_(single, pc.and_(pair, differs)))


def _with_next(values: pa.Array, compare: Any) -> pa.Array:
    """``compare(values[i], values[i + 1])`` for each row i (a bool array; False for the
    last row)."""
    count = len(values)
    if count < 2:
        return pa.array([False] * count)
    return pa.concat_arrays(
        [compare(values.slice(0, count - 1), values.slice(1)), pa.array([False])]
    )


def _write_parquet(
    path: Path, blocks: Iterable[pa.Table], *, meta: dict[str, Any], row_group_rows: int
) -> Counter[str]:
    """Write the change rows of ``blocks`` to the local file ``path`` (zstd, row groups of
    ``row_group_rows`` rows, ``meta`` as JSON under the schema key ``embedline``); return
    the rows by change. Holds one row group and one block at most."""
    schema = CHANGES_SCHEMA.with_metadata({_META_KEY: json.dumps(meta, sort_keys=True).encode()})
    counts: Counter[str] = Counter()
    # a dictionary for ``change`` (four values) only: ids and hashes are unique, and hashing
    # them into a dictionary Parquet then abandons cost half the write (31.8 -> 17.5 ms for
    # 64,000 rows)
    with pq.ParquetWriter(
        str(path), schema, compression="zstd", use_dictionary=["change"]
    ) as writer:
        pending = pa.Table.from_batches([], schema=CHANGES_SCHEMA)
        for block in blocks:
            counts.update(
                {
                    str(v["values"]): int(v["counts"])
                    for v in block["change"].value_counts().to_pylist()
                }
            )
            pending = pa.concat_tables([pending, block])
            while pending.num_rows >= row_group_rows:
                writer.write_table(pending.slice(0, row_group_rows), row_group_size=row_group_rows)
                pending = pending.slice(row_group_rows)
        if pending.num_rows:
            writer.write_table(pending, row_group_size=row_group_rows)
    return counts


def write_changes(
    store: ObjectStore,
    *,
    run_key: str,
    chunks: Sequence[dict[str, Any]],
    base: dict[str, Any] | None,
    kept_columns: Sequence[str] = (),
    scratch_dir: Path,
    limits: SortLimits = SortLimits(),
    stats: SortStats | None = None,
    same_rows: bool = False,
) -> ChangeCounts:
    """Compute this run's change set against ``base`` (a manifest, or None) and create it
    (``kept_columns``, ``limits``, ``stats``: see ``diff_blocks``). ``same_rows``: the
    caller knows both runs hold the same rows (``tasks.commit.commit_run.run_fingerprint``), so the
    change set is empty and no chunk object is read.

    Idempotent: if ``changes/{run_key}.parquet`` already exists (an earlier attempt of this
    run died before its manifest), that object is kept, with the base it names, since it is
    still a true change set relative to that base; nothing is overwritten, nor computed again.
    The object is written to a file under ``scratch_dir`` (a directory the caller owns,
    never /tmp implicitly; about 80 bytes a row of each side are sorted there too, and all
    of it is deleted before returning) and streamed to the store from there.

    :raises ConflictError: the key holds an object that is not this run's change set.
    :raises FileNotFoundError: a chunk object is missing.
    :raises OSError: ``scratch_dir`` is full or not writable.
    """
    base_run_key = str(base["run_key"]) if base else None

    def blocks(tmp: Path) -> Iterable[pa.Table]:
        if same_rows and base:
            return iter(())
        base_chunks = list(base["chunks"]) if base else []
        return diff_blocks(
            store, chunks, base_chunks, kept_columns, scratch_dir=tmp, limits=limits, stats=stats
        )

    return _create(
        store,
        run_key=run_key,
        base_run_key=base_run_key,
        rows=sum(int(c["rows"]) for c in chunks),
        scratch_dir=scratch_dir,
        blocks=blocks,
        row_group_rows=limits.block_rows,
    )


def write_change_table(
    store: ObjectStore,
    *,
    run_key: str,
    base_run_key: str,
    table: pa.Table,
    rows: int,
    scratch_dir: Path,
) -> ChangeCounts:
    """Create the change set of a delta night from its rows, already computed
    (``tasks/plan/delta.py``: ``CHANGES_SCHEMA``, sorted by id) against ``base_run_key``;
    ``rows``: ids with a vector in the run. Idempotent as ``write_changes``: a change set
    already under the run's key is kept.

    :raises ConflictError: the key holds an object that is not this run's change set.
    :raises OSError: ``scratch_dir`` is full or not writable.
    """
    return _create(
        store,
        run_key=run_key,
        base_run_key=base_run_key,
        rows=rows,
        scratch_dir=scratch_dir,
        blocks=lambda _: [table.cast(CHANGES_SCHEMA)] if table.num_rows else [],
        row_group_rows=SortLimits().block_rows,
    )


def _create(
    store: ObjectStore,
    *,
    run_key: str,
    base_run_key: str | None,
    rows: int,
    scratch_dir: Path,
    blocks: Callable[[Path], Iterable[pa.Table]],
    row_group_rows: int,
) -> ChangeCounts:
    """The one way a change set is created: kept if the run's key already holds one
    (``_existing_counts``), else its rows (``blocks`` of a temporary directory under
    ``scratch_dir``) written to a local Parquet file and created in the store with a
    conditional write; a concurrent attempt's object, if it won, stands."""
    key = changes_object_key(run_key)
    found = _existing_counts(store, key, run_key, rows=rows)
    if found is not None:
        return found
    meta = {"format": CHANGES_FORMAT, "run_key": run_key, "base_run_key": base_run_key}
    with tempfile.TemporaryDirectory(dir=scratch_dir, prefix="changes-") as tmp:
        path = Path(tmp, "changes.parquet")
        counts = _write_parquet(path, blocks(Path(tmp)), meta=meta, row_group_rows=row_group_rows)
        try:
            put = store.put_file_if_absent(key, path, content_type=_CONTENT_TYPE)
        except ConflictError:
            found = _existing_counts(store, key, run_key, rows=rows)
            if found is None:
                raise
            return found
    return _change_counts(key, put.sha256, base_run_key, counts, rows=rows)


def _change_counts(
    key: str, sha256: str, base_run_key: str | None, counts: Counter[str], *, rows: int
) -> ChangeCounts:
    """``ChangeCounts`` from the rows by change; ``rows`` = ids with a vector in this run,
    so unchanged = rows - added - changed."""
    added, changed = counts["added"], counts["changed"]
    return ChangeCounts(
        object=key,
        sha256=sha256,
        base_run_key=base_run_key,
        added=added,
        changed=changed,
        removed=counts["removed"],
        unchanged=rows - added - changed,
    )


def _existing_counts(
    store: ObjectStore, key: str, run_key: str, *, rows: int
) -> ChangeCounts | None:
    """The counts of the change set at ``key`` if it is ``run_key``'s, else None (absent, or
    not a change set of this run). Reads its footer and ``change`` column a row group at a
    time (``rows``: see ``_change_counts``)."""
    counts: Counter[str] = Counter()
    try:
        with store.open_read(key) as fh:
            parquet = pq.ParquetFile(fh)
            meta = dict(json.loads((parquet.schema_arrow.metadata or {})[_META_KEY]))
            if meta.get("run_key") != run_key:
                return None
            for batch in parquet.iter_batches(columns=["change"]):
                counts.update(
                    {
                        str(v["values"]): int(v["counts"])
                        for v in batch.column(0).value_counts().to_pylist()
                    }
                )
    except FileNotFoundError:
        return None
    except (pa.ArrowInvalid, KeyError, TypeError, ValueError):  # not a change set
        return None
    sha256 = store.head_sha256(key)
    if sha256 is None:
        return None
    return _change_counts(key, sha256, meta.get("base_run_key"), counts, rows=rows)
