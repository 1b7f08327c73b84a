"""Sorted runs merged in id-aligned blocks: every row once, blocks in id order, an id's rows
of every source in one block, and the rows held bounded by the limits (counted by the code)."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from tasks.commit.sorted_spills import (
    SortedRun,
    SortLimits,
    SortStats,
    merge_blocks,
    reduce_runs,
    write_runs,
)

SCHEMA = pa.schema([("id", pa.string()), ("value", pa.string())])


def _tables(ids: list[str], size: int) -> list[pa.Table]:
    return [
        pa.table(
            {"id": ids[i : i + size], "value": [f"v{x}" for x in ids[i : i + size]]}, schema=SCHEMA
        )
        for i in range(0, len(ids), size)
    ]


def _sources(
    tmp_path: Path, limits: SortLimits, stats: SortStats, sides: list[list[str]], size: int = 37
) -> list[list[SortedRun]]:
    """Runs of each side, read as tables of ``size`` rows."""
    return [
        write_runs(_tables(ids, size), tmp_path, name=f"s{n}", limits=limits, stats=stats)
        for n, ids in enumerate(sides)
    ]


def test_many_runs_merge_in_passes_with_the_rows_held_bounded(tmp_path: Path) -> None:
    rng = random.Random(7)
    universe = [f"{rng.randrange(10**9):x}-{i}" for i in range(20_000)]
    sides = [rng.sample(universe, 12_000), rng.sample(universe, 9_000)]
    limits, stats = SortLimits(run_rows=300, batch_rows=16, fan_in=8), SortStats()

    sources = _sources(tmp_path, limits, stats, sides)
    reduced = reduce_runs(sources, SCHEMA, tmp_path, limits=limits, stats=stats)
    blocks = list(merge_blocks(reduced, SCHEMA, limits=limits, stats=stats))

    per_run = 37 * 9  # tables of 37 rows until 300 are reached
    assert stats.runs == -(-12_000 // per_run) + -(-9_000 // per_run) == 65
    assert stats.merged_runs >= 2
    assert sum(len(runs) for runs in reduced) <= limits.fan_in
    assert len(list(tmp_path.iterdir())) == sum(len(runs) for runs in reduced)  # merged: gone
    assert stats.blocks > len(blocks) > 10  # the merge passes' blocks count too
    # the bound, counted by the merge itself: buffers of fan_in runs + one gathered block
    assert 0 < stats.peak_merge_rows <= limits.merge_rows == 3 * 8 * 16
    assert stats.peak_run_rows <= limits.run_rows + 37
    previous = ""
    for block in blocks:
        ids = [sorted(t["id"].to_pylist()) for t in block]
        assert all(i > previous for side in ids for i in side)  # ranges ascend, disjoint
        previous = max(i for side in ids for i in side)
    for n, side in enumerate(sides):
        assert sorted(i for b in blocks for i in b[n]["id"].to_pylist()) == sorted(side)
    block_of = [
        {i: k for k, b in enumerate(blocks) for i in b[n]["id"].to_pylist()} for n in range(2)
    ]
    both = set(sides[0]) & set(sides[1])
    assert all(block_of[0][i] == block_of[1][i] for i in both)


def test_runs_are_in_utf8_byte_order(tmp_path: Path) -> None:
    ids = ["\U0001f600", "\uffff", "é", "z", "Z", "a", "ab", "", "a\x00"]
    limits, stats = SortLimits(batch_rows=2), SortStats()
    (run,) = write_runs(_tables(ids, 4), tmp_path, name="r", limits=limits, stats=stats)

    table = pa.ipc.open_stream(run.path.read_bytes()).read_all()

    assert table["id"].to_pylist() == sorted(ids, key=lambda s: s.encode("utf-8"))
    assert table["id"].to_pylist() == sorted(ids)  # code point order: the cutoff's
    assert (run.rows, run.batch_rows) == (9, 2)


def test_wide_rows_get_smaller_batches(tmp_path: Path) -> None:
    ids = [f"{i:04d}" + "x" * 2000 for i in range(50)]
    limits, stats = SortLimits(batch_rows=64, batch_bytes=10_000), SortStats()

    (run,) = write_runs(_tables(ids, 50), tmp_path, name="r", limits=limits, stats=stats)

    assert run.batch_rows == 2  # 10,000 bytes / about 4,000 bytes a row (id and value)
    reader = pa.ipc.open_stream(run.path.read_bytes())
    assert max(b.num_rows for b in reader) == 2


def test_limits_and_fan_in_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fan_in"):
        SortLimits(fan_in=1)
    with pytest.raises(ValueError, match="positive"):
        SortLimits(batch_rows=0)
    limits, stats = SortLimits(run_rows=2, fan_in=2), SortStats()
    (runs,) = _sources(tmp_path, limits, stats, [["a", "b", "c", "d", "e"]], size=1)
    with pytest.raises(ValueError, match="reduce_runs first"):
        next(merge_blocks([runs], SCHEMA, limits=limits, stats=stats))
