"""``row_sources._take``: each row left takes the first source of its text (lowest source
number, then position), unless its own chunk keeps that source; the same whether the index
is far larger than the run (only the entries the run can use are sorted) or not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapters.row_facts import ROW_DTYPE
from adapters.scratch import Spill
from tasks.reuse.row_sources import NEED_DTYPE, _take


def _reference(run, left, prefixes, numbers, positions, owner_of):  # type: ignore[no-untyped-def]
    """Row by row, as the rule reads."""
    out = {}
    for i, row in enumerate(run):
        if not left[i]:
            continue
        same = np.flatnonzero(prefixes == row["prefix"])
        if not len(same):
            continue
        best = min(same, key=lambda j: (numbers[j], positions[j]))
        if owner_of[numbers[best]] != row["chunk"]:
            out[(int(row["chunk"]), int(row["position"]))] = (
                int(numbers[best]),
                int(positions[best]),
            )
    return out


@pytest.mark.parametrize(("run_rows", "index_rows"), [(30, 5_000), (400, 300), (50, 0)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_take_matches_the_rule_row_by_row(
    tmp_path: Path, run_rows: int, index_rows: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    texts = rng.integers(1, 2**63, size=60, dtype=np.uint64)  # few texts: many shared
    run = np.zeros(run_rows, dtype=ROW_DTYPE)
    run["prefix"] = rng.choice(texts, size=run_rows)
    run["chunk"] = rng.integers(0, 5, size=run_rows)
    run["position"] = np.arange(run_rows)
    run = run[np.lexsort((run["position"], run["chunk"], run["prefix"]))]
    other = rng.integers(1, 2**63, size=index_rows, dtype=np.uint64)  # texts not in the run
    prefixes = np.where(rng.random(index_rows) < 0.05, rng.choice(texts, size=index_rows), other)
    numbers = rng.integers(0, 40, size=index_rows).astype(np.int64)
    positions = rng.integers(0, 1_000, size=index_rows).astype(np.int64)
    owner_of = np.where(rng.random(40) < 0.2, rng.integers(0, 5, size=40), -1).astype(np.int64)
    left = rng.random(run_rows) < 0.8
    expected = _reference(run, left.copy(), prefixes, numbers, positions, owner_of)

    needs = Spill(tmp_path / "needs", NEED_DTYPE)
    was_left = left.copy()
    taken = _take(needs, run, left, prefixes, numbers, positions, owner_of)
    got = np.concatenate([needs.read(p) for p in range(64)]) if taken else needs.read(0)
    found = {
        (int(n["chunk"]), int(n["position"])): (int(n["source"]), int(n["source_position"]))
        for n in got
    }
    assert taken == len(expected) == len(found)
    assert found == expected
    hit = {(int(r["chunk"]), int(r["position"])) for r in run[was_left & ~left]}
    assert hit == set(expected)
