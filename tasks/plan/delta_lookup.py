"""The delta night's lookup: each input row joined once, by id, with the rows its base run
takes from its objects, and classified (docs/nights.md; ``tasks/plan/delta.py`` plans the
night from what it finds).

Both sides are Arrow tables of keys only (id, text SHA-256 as raw 32 bytes, kept-values hash,
and where the row sits: the input's planned chunk and position, the base's manifest entry).
More rows than ``_PARTITION_ROWS`` on the two sides are spilled to the night's scratch
directory in partitions of ids and joined a partition at a time, so memory stays flat.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from adapters.row_facts import chunk_rows, id_digests
from adapters.scratch import (
    Scratch,
    digests,
    hex_digests,
    stable_order,
)
from embedline.models import InputPlan
from embedline.protocols import ObjectStore
from tasks.commit.changes import CHANGES_SCHEMA, read_entry_keys

__all__ = ["Found", "look_up"]


@dataclass(slots=True)
class Found:
    """What the lookup found: the rows to write (tables of their planned ``chunk`` and
    ``position``), the ids each base entry drops (by its position in ``base["chunks"]``), the
    change rows, the counts."""

    written: list[pa.Table] = field(default_factory=list)
    empties: list[pa.Table] = field(default_factory=list)
    drops: dict[int, list[str]] = field(default_factory=dict)
    changes: list[pa.Table] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


def look_up(store: ObjectStore, plan: InputPlan, base: dict[str, Any], scratch: Scratch) -> Found:
    """Join the input's rows with the base's by id, one partition of ids at a time
    (``_PARTITION_ROWS`` rows of both sides each; partitioned by a process-local id digest
    and spilled to ``scratch`` as Arrow files when there is more than one), and classify."""
    parts = max(1, -(-(plan.rows + int(base["rows_published"])) // _PARTITION_ROWS))
    found = Found()
    sides: Iterable[tuple[pa.Table, pa.Table]]
    if parts == 1:
        sides = [(_input_rows(plan), _base_rows(store, base, plan.source.kept_columns))]
    else:
        sides = _partitioned(store, plan, base, scratch, parts)
    for rows, held in sides:
        joined = rows.join(held, keys="id", join_type="full outer", coalesce_keys=True)
        facts = _classify(joined)
        found.counts.update({k: int(pc.sum(v).as_py() or 0) for k, v in facts.items()})
        found.written.append(joined.filter(facts["write"]).select(["chunk", "position"]))
        found.empties.append(joined.filter(facts["empty"]).select(["id", "chunk", "position"]))
        found.changes.append(_change_rows(joined, facts))
        dropped = joined.filter(facts["drop"])
        for entry, row_id in zip(
            dropped.column("entry").to_pylist(), dropped.column("id").to_pylist(), strict=True
        ):
            found.drops.setdefault(int(entry), []).append(str(row_id))
    return found


def _partitioned(
    store: ObjectStore, plan: InputPlan, base: dict[str, Any], scratch: Scratch, parts: int
) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Both sides spilled to ``parts`` Arrow files each under ``scratch`` by
    ``id_digests(id) % parts``, then read back a partition at a time."""
    kept = plan.source.kept_columns
    into = [scratch.file(f"lookup-in-{p}.arrow") for p in range(parts)]
    held = [scratch.file(f"lookup-base-{p}.arrow") for p in range(parts)]
    _spill(_input_batches(plan), into, _INPUT_SCHEMA)
    _spill(_base_batches(store, base, kept), held, _BASE_SCHEMA)
    for mine, theirs in zip(into, held, strict=True):
        yield _read_spill(mine), _read_spill(theirs)
        mine.unlink()
        theirs.unlink()


def _spill(tables: Iterator[pa.Table], paths: list[Path], schema: pa.Schema) -> None:
    """Write each table's rows to ``paths[id_digests(id) % len(paths)]`` (Arrow IPC files
    of ``schema``), ``_SPILL_ROWS`` rows at a time: one sort by partition and a slice per
    partition, so each file gets batches of ``_SPILL_ROWS / len(paths)`` rows, not one per
    planned chunk."""
    writers = [pa.ipc.new_file(str(p), schema) for p in paths]
    every = np.arange(len(paths) + 1, dtype=np.uint64)
    try:
        for table in _regrouped(tables, schema):
            part = id_digests(table.column("id").to_pylist()) % np.uint64(len(paths))
            order = stable_order(part)
            cuts = np.searchsorted(part[order], every)
            table = table.take(pa.array(order))
            for p, (start, stop) in enumerate(pairwise(cuts)):
                if stop > start:
                    writers[p].write_table(table.slice(int(start), int(stop - start)))
    finally:
        for writer in writers:
            writer.close()


def _regrouped(tables: Iterator[pa.Table], schema: pa.Schema) -> Iterator[pa.Table]:
    """``tables`` cast to ``schema`` and gathered into tables of ``_SPILL_ROWS`` rows or
    more (the last may be shorter)."""
    held: list[pa.Table] = []
    rows = 0
    for table in tables:
        held.append(table.cast(schema))
        rows += table.num_rows
        if rows >= _SPILL_ROWS:
            yield pa.concat_tables(held)
            held, rows = [], 0
    if held:
        yield pa.concat_tables(held)


def _read_spill(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


#: Rows of both sides joined at once: past it the lookup partitions the ids (about 400 bytes
#: a row of both sides are held while a partition is joined, so about 200 MB at most).
_PARTITION_ROWS = 500_000
#: Rows the spill sorts by partition at once (about 100 bytes a row).
_SPILL_ROWS = 1 << 16
#: Base objects whose key columns are read at once (ranged reads on S3 wait on the network).
_READ_AHEAD = 8

#: An input row as the lookup joins it: text hashes as raw SHA-256s (half the bytes to
#: spill and join); a row to write is read back whole from planning's ``chunks.arrow``.
_INPUT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text_sha256", pa.binary(32)),
        ("empty", pa.bool_()),
        ("kept_sha256", pa.string()),
        ("chunk", pa.int32()),
        ("position", pa.int32()),
    ]
)
_BASE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("base_text", pa.binary(32)),
        ("base_kept", pa.string()),
        ("entry", pa.int32()),
    ]
)


def _input_batches(plan: InputPlan) -> Iterator[pa.Table]:
    """Every input row, a planned chunk at a time (``_INPUT_SCHEMA``: its facts from the
    planning pass and where planning put it, ``chunk`` and ``position``)."""
    assert plan.scratch is not None
    for spec in plan.chunks:
        batch = chunk_rows(plan.scratch, spec.index)  # mapped a chunk at a time: RSS stays flat
        n = batch.num_rows
        yield pa.table(
            [
                batch.column("id"),
                _binary32(batch.column("text_sha256")),
                batch.column("empty"),
                batch.column("kept_sha256"),
                pa.repeat(pa.scalar(spec.index, pa.int32()), n),
                pa.array(np.arange(n, dtype=np.int32)),
            ],
            schema=_INPUT_SCHEMA,
        )


def _binary32(hex_hashes: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Hex SHA-256s as raw ones (``binary(32)``; decoded in numpy, ``scratch.digests``)."""
    raw = digests(hex_hashes)
    return pa.Array.from_buffers(pa.binary(32), len(raw), [None, pa.py_buffer(raw.tobytes())])


def _hex(raw: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Raw SHA-256s (``binary(32)``, no nulls) as hex strings (``scratch.hex_digests``)."""
    array = raw.combine_chunks() if isinstance(raw, pa.ChunkedArray) else raw
    return hex_digests(array.buffers()[1].to_pybytes()[array.offset * 32 :][: len(array) * 32])


def _base_batches(
    store: ObjectStore, base: dict[str, Any], kept: Sequence[str]
) -> Iterator[pa.Table]:
    """The rows the base run takes, an entry at a time (``_BASE_SCHEMA``: ``base_text`` its
    text hash, ``base_kept`` its kept values' hash or null, ``entry`` its manifest entry's
    position in ``base["chunks"]``), reading only the objects' key columns, ``_READ_AHEAD``
    objects at once and no further ahead of the consumer (memory: ``_READ_AHEAD`` objects'
    keys, whatever the run's size)."""
    entries = [(i, c) for i, c in enumerate(base["chunks"]) if int(c["rows"])]
    with ThreadPoolExecutor(_READ_AHEAD) as pool:
        ahead: deque[tuple[int, Future[pa.Table]]] = deque()
        try:
            for i, entry in entries:
                ahead.append((i, pool.submit(read_entry_keys, store, entry, kept)))
                if len(ahead) >= _READ_AHEAD:
                    yield _keyed(*ahead.popleft(), kept)
            while ahead:
                yield _keyed(*ahead.popleft(), kept)
        finally:
            for _, future in ahead:
                future.cancel()


def _keyed(i: int, read: Future[pa.Table], kept: Sequence[str]) -> pa.Table:
    """Entry ``i``'s key table (``read``'s result) as ``_BASE_SCHEMA`` rows."""
    table = read.result()
    kept_hash = table.column("kept_sha256") if kept else pa.nulls(table.num_rows, pa.string())
    return pa.table(
        [
            table.column("id"),
            _binary32(table.column("text_sha256")),
            kept_hash,
            pa.repeat(pa.scalar(i, pa.int32()), table.num_rows),
        ],
        schema=_BASE_SCHEMA,
    )


def _input_rows(plan: InputPlan) -> pa.Table:
    return _concat(_input_batches(plan), _INPUT_SCHEMA)


def _base_rows(store: ObjectStore, base: dict[str, Any], kept: Sequence[str]) -> pa.Table:
    return _concat(_base_batches(store, base, kept), _BASE_SCHEMA)


def _concat(tables: Iterator[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([t.cast(schema) for t in tables] or [schema.empty_table()])


def _classify(joined: pa.Table) -> dict[str, pa.ChunkedArray]:
    """Boolean columns over ``joined`` (input rows full-outer-joined with the base's by id):
    ``empty``, ``unchanged``, ``write``, ``added``, ``changed``, ``text_changed``,
    ``removed`` and ``drop`` (the base row is not taken any more)."""
    in_input = pc.is_valid(joined.column("chunk"))
    in_base = pc.is_valid(joined.column("entry"))
    empty = pc.and_(in_input, pc.fill_null(joined.column("empty"), False))
    live = pc.and_(in_input, pc.invert(empty))
    same_text = pc.fill_null(
        pc.equal(joined.column("text_sha256"), joined.column("base_text")), False
    )
    kept_new, kept_old = joined.column("kept_sha256"), joined.column("base_kept")
    same_kept = pc.or_(
        pc.and_(pc.is_null(kept_new), pc.is_null(kept_old)),
        pc.fill_null(pc.equal(kept_new, kept_old), False),
    )
    unchanged = pc.and_(pc.and_(live, in_base), pc.and_(same_text, same_kept))
    write = pc.and_(live, pc.invert(unchanged))
    changed = pc.and_(write, in_base)
    removed = pc.and_(in_base, pc.invert(live))
    return {
        "empty": empty,
        "unchanged": unchanged,
        "write": write,
        "added": pc.and_(write, pc.invert(in_base)),
        "changed": changed,
        "text_changed": pc.and_(changed, pc.invert(same_text)),
        "removed": removed,
        "drop": pc.or_(changed, removed),
    }


def _change_rows(joined: pa.Table, facts: dict[str, pa.ChunkedArray]) -> pa.Table:
    """The change set's rows (``CHANGES_SCHEMA``), sorted by id (UTF-8 byte order)."""
    added, changed, removed = facts["added"], facts["changed"], facts["removed"]
    change = pc.if_else(added, "added", pc.if_else(changed, "changed", "removed"))
    text = pc.if_else(removed, joined.column("base_text"), joined.column("text_sha256"))
    text_changed = pc.if_else(changed, facts["text_changed"], pa.scalar(None, pa.bool_()))
    table = pa.table(
        {
            "id": joined.column("id"),
            "change": change,
            "text_sha256": text,
            "text_changed": text_changed,
        }
    ).filter(pc.or_(pc.or_(added, changed), removed))
    table = table.set_column(2, "text_sha256", _hex(table.column("text_sha256")))
    return table.cast(CHANGES_SCHEMA)
