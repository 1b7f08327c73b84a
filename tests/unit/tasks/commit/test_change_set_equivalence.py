"""The change set computed in bounded memory (sorted runs on disk, merged in blocks) equals
a plain dict-based diff sorted by UTF-8 bytes, over many seeded random cases, with limits
small enough that every case spills many runs, merges again and crosses many blocks."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adapters.object_store import LocalDirStore
from embedline.keys import text_sha256
from tasks.commit.changes import diff_blocks, write_changes
from tasks.commit.sorted_spills import SortLimits, SortStats

#: Ids that sort differently by UTF-8 bytes than by UTF-16 units or by locale, prefixes of
#: each other, and the empty string.
ODD_IDS = [
    "",
    "a",
    "ab",
    "abc",
    "abd",
    "b",
    "B",
    "Z",
    "é",
    "e\u0301",
    "日本",
    "日本語",
    "\uffff",
    "\U0001f600",
    "\U0001f600x",
    "a\x00",
    "id 10",
    "id 9",
    "ñ",
    "z",
]

Row = tuple[str, str, str | None]  # id, text, kept title (None: no value)


def _object(store: LocalDirStore, name: str, rows: list[Row], kept: bool) -> dict[str, Any]:
    """Store a chunk-shaped object (id, text_sha256[, title]); return its manifest entry."""
    columns: dict[str, list[Any]] = {
        "id": [r[0] for r in rows],
        "text_sha256": [text_sha256(r[1]) for r in rows],
    }
    if kept:
        columns["title"] = [r[2] for r in rows]
    table = pa.table(columns, schema=pa.schema([(c, pa.string()) for c in columns]))
    key = f"chunks/{name}.parquet"
    path = Path(store.uri_for(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)  # not put_if_absent: its fsyncs made this file slow
    return {"object": key, "rows": len(rows)}


def _chunks(
    rng: random.Random, store: LocalDirStore, prefix: str, rows: list[Row], kept: bool
) -> list[dict[str, Any]]:
    """Cut ``rows`` (shuffled) into objects of 1 to 7 rows, plus a 0-row object."""
    rows = rows[:]
    rng.shuffle(rows)
    chunks, start = [], 0
    while start < len(rows):
        size = rng.randint(1, 7)
        chunks.append(_object(store, f"{prefix}-{len(chunks)}", rows[start : start + size], kept))
        start += size
    chunks.insert(rng.randint(0, len(chunks)), _object(store, f"{prefix}-empty", [], kept))
    return chunks


def reference(new: list[Row], old: list[Row], kept: bool) -> list[dict[str, Any]]:
    """The change set by definition (docs/reference/output-layout.md), with dicts, sorted by UTF-8
    bytes."""
    now, before = {r[0]: r for r in new}, {r[0]: r for r in old}
    out = []
    for id_ in now.keys() | before.keys():
        if id_ not in before:
            out.append(
                {
                    "id": id_,
                    "change": "added",
                    "text_sha256": text_sha256(now[id_][1]),
                    "text_changed": None,
                }
            )
        elif id_ not in now:
            out.append(
                {
                    "id": id_,
                    "change": "removed",
                    "text_sha256": text_sha256(before[id_][1]),
                    "text_changed": None,
                }
            )
        else:
            text_changed = now[id_][1] != before[id_][1]
            if text_changed or (kept and now[id_][2] != before[id_][2]):
                out.append(
                    {
                        "id": id_,
                        "change": "changed",
                        "text_sha256": text_sha256(now[id_][1]),
                        "text_changed": text_changed,
                    }
                )
    return sorted(out, key=lambda r: r["id"].encode("utf-8"))


def _case(rng: random.Random, shape: str) -> tuple[list[Row], list[Row]]:
    """An old and a new run's rows: ids from ``ODD_IDS`` and numbered ones, few texts."""
    universe = ODD_IDS + [f"{rng.choice('abxé')}{i}" for i in range(rng.randint(0, 120))]
    texts, titles = ["t1", "t2", "t3", ""], ["A", "B", None]
    old = [(i, rng.choice(texts), rng.choice(titles)) for i in universe if rng.random() < 0.7]
    if shape == "both empty":
        return [], []
    if shape == "old empty":
        return [(i, rng.choice(texts), rng.choice(titles)) for i in universe], []
    if shape == "new empty":
        return [], old
    if shape == "all changed":
        return [(i, t + "!", k) for i, t, k in old], old
    new = []
    for id_, text, title in old:
        roll = rng.random()
        if roll < 0.15:
            continue  # removed
        if roll < 0.3:
            text = rng.choice(texts) + "?"
        elif roll < 0.4:
            title = rng.choice(titles)
        new.append((id_, text, title))
    taken = {r[0] for r in old}
    new += [
        (i, rng.choice(texts), rng.choice(titles))
        for i in universe
        if i not in taken and rng.random() < 0.5
    ]
    return new, old


def _tiny_limits(rng: random.Random) -> SortLimits:
    return SortLimits(
        run_rows=rng.randint(1, 12),
        run_bytes=1 << 30,
        batch_rows=rng.randint(1, 4),
        batch_bytes=1 << 30,
        fan_in=rng.randint(2, 5),
    )


def _shared_split(rng: random.Random, new: list[Row], old: list[Row]) -> tuple[list[Row], ...]:
    """Rows both runs hold unchanged, some of which go into objects both list."""
    same = sorted(set(new) & set(old))
    shared = [r for r in same if rng.random() < 0.5]
    return shared, [r for r in new if r not in shared], [r for r in old if r not in shared]


SHAPES = ["mixed"] * 6 + ["both empty", "old empty", "new empty", "all changed"]


@pytest.mark.parametrize("seed", range(60))
def test_bounded_diff_equals_a_dict_diff(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    kept = rng.random() < 0.5
    new, old = _case(rng, SHAPES[seed % len(SHAPES)])
    store = LocalDirStore(tmp_path / "out")
    shared_rows, new_only, old_only = _shared_split(rng, new, old)
    shared = _chunks(rng, store, "shared", shared_rows, kept) if shared_rows else []
    current = shared + _chunks(rng, store, "new", new_only, kept)
    base = _chunks(rng, store, "old", old_only, kept) + shared
    limits, stats = _tiny_limits(rng), SortStats()
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    blocks = list(
        diff_blocks(
            store,
            current,
            base,
            ["title"] if kept else [],
            scratch_dir=scratch,
            limits=limits,
            stats=stats,
        )
    )

    got = pa.concat_tables(blocks).to_pylist() if blocks else []
    assert got == reference(new, old, kept)
    assert all(b.num_rows for b in blocks)
    assert stats.peak_merge_rows <= limits.merge_rows
    assert stats.peak_run_rows <= limits.run_rows + 7  # plus one object at most


@pytest.mark.parametrize("seed", range(12))
def test_written_change_set_has_the_rows_schema_metadata_and_counts(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(1000 + seed)
    kept = seed % 2 == 0
    new, old = _case(rng, SHAPES[seed % len(SHAPES)])
    store = LocalDirStore(tmp_path / "out")
    current = _chunks(rng, store, "new", new, kept)
    base_chunks = _chunks(rng, store, "old", old, kept)
    base = {"run_key": "r1", "chunks": base_chunks}
    limits = _tiny_limits(rng)
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    counts = write_changes(
        store,
        run_key="r2",
        chunks=current,
        base=base,
        kept_columns=["title"] if kept else [],
        scratch_dir=scratch,
        limits=limits,
    )

    path = Path(store.uri_for(counts.object))
    table = pq.read_table(path)
    want = reference(new, old, kept)
    assert table.to_pylist() == want
    assert table.schema == pa.schema(
        [
            ("id", pa.string()),
            ("change", pa.string()),
            ("text_sha256", pa.string()),
            ("text_changed", pa.bool_()),
        ]
    )
    assert json.loads(table.schema.metadata[b"embedline"]) == {
        "format": "embedline.changes.v1",
        "run_key": "r2",
        "base_run_key": "r1",
    }
    by_change = {c: sum(r["change"] == c for r in want) for c in ("added", "changed", "removed")}
    assert (counts.added, counts.changed, counts.removed) == (
        by_change["added"],
        by_change["changed"],
        by_change["removed"],
    )
    assert counts.unchanged == len(new) - by_change["added"] - by_change["changed"]
    assert counts.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert pq.ParquetFile(path).metadata.num_row_groups == -(-len(want) // limits.block_rows)
    assert list(scratch.iterdir()) == []  # runs and the written file are gone
