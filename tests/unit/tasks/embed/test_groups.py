"""The chunk groups rule (tasks/embed/groups.py): bounds, packing, the parallel floor."""

from __future__ import annotations

import collections
import heapq
import random

import pytest

from embedline.models import ChunkSpec
from tasks.embed.groups import (
    CLUSTER_CHUNKS_PER_RUN,
    MAX_GROUPS,
    ChunkGroup,
    chunk_groups,
    group_name,
)


def _specs(n: int, rows: int = 1000) -> list[ChunkSpec]:
    return [
        ChunkSpec(i, f"{i:064x}", 1 + i * rows, 2 + i * rows, rows, i * 10, i * 10 + 10, "h")
        for i in range(n)
    ]


def _check(groups: list[tuple[ChunkSpec, ...]], specs: list[ChunkSpec]) -> None:
    """Every spec in exactly one group, groups consecutive and in chunk order."""
    assert [s for g in groups for s in g] == specs
    assert all(groups)


def test_a_first_run_of_10m_rows_makes_at_most_max_groups_task_runs() -> None:
    specs = _specs(10_000)
    groups = chunk_groups(specs, to_send=lambda s: s.rows, chunk_size=1000, parallel=9)
    _check(groups, specs)
    assert len(groups) <= MAX_GROUPS
    assert len(groups) == 910  # 11 chunks (11,000 rows to send) per task run
    assert {len(g) for g in groups} == {11, 1}


def test_chunks_full_of_rows_to_send_are_groups_of_one() -> None:
    specs = _specs(50)
    groups = chunk_groups(specs, to_send=lambda s: s.rows, chunk_size=1000, parallel=8)
    assert groups == [(s,) for s in specs]


def test_chunks_with_little_to_send_are_packed_up_to_chunk_size_rows() -> None:
    specs = _specs(2000)  # 5 rows to send in each: a lightly edited night
    groups = chunk_groups(specs, to_send=lambda s: 5, chunk_size=1000, parallel=8)
    _check(groups, specs)
    assert len(groups) == 10 and {len(g) for g in groups} == {200}


def test_a_chunk_with_nothing_to_send_still_weighs_one_row() -> None:
    specs = _specs(3000)
    groups = chunk_groups(specs, to_send=lambda s: 0, chunk_size=1000, parallel=1)
    _check(groups, specs)
    assert [len(g) for g in groups] == [1000, 1000, 1000]


def test_a_small_run_has_at_least_as_many_groups_as_run_at_once() -> None:
    specs = _specs(40)
    groups = chunk_groups(specs, to_send=lambda s: 1, chunk_size=1000, parallel=9)
    _check(groups, specs)
    assert len(groups) == 9
    assert max(len(g) for g in groups) - min(len(g) for g in groups) <= 3


def test_fewer_chunks_than_run_at_once_run_one_each() -> None:
    specs = _specs(3)
    assert chunk_groups(specs, to_send=lambda s: 1, chunk_size=1000, parallel=9) == [
        (s,) for s in specs
    ]
    assert chunk_groups([], to_send=lambda s: 1, chunk_size=1000, parallel=9) == []


def test_the_floor_splits_the_heaviest_group_where_its_rows_halve() -> None:
    specs = _specs(6)
    sends = {0: 10, 1: 10, 2: 10, 3: 10, 4: 300, 5: 300}
    groups = chunk_groups(specs, to_send=lambda s: sends[s.index], chunk_size=1000, parallel=2)
    assert [[s.index for s in g] for g in groups] == [[0, 1, 2, 3, 4], [5]]


@pytest.mark.parametrize("seed", range(20))
def test_bounds_hold_for_any_sizes(seed: int) -> None:
    rng = random.Random(seed)
    specs = _specs(rng.randint(1, 3000), rows=rng.choice([10, 100, 1000]))
    sends = {s.index: rng.choice([0, 1, 5, s.rows // 2, s.rows]) for s in specs}
    parallel, most = rng.randint(1, 64), rng.choice([10, 100, MAX_GROUPS])
    groups = chunk_groups(
        specs,
        to_send=lambda s: sends[s.index],
        chunk_size=specs[0].rows,
        parallel=parallel,
        max_groups=most,
    )
    _check(groups, specs)
    assert min(parallel, len(specs), most) <= len(groups) <= most


def _simulate(groups: list[tuple[ChunkSpec, ...]], threads: int) -> tuple[list[int], list[int]]:
    """Each group, in order, on the thread freed first (a chunk: one time unit, as with
    one request a chunk at a fixed latency): the times at which a thread ended a group and
    started another (hydrating it), and each thread's last end."""
    free = [(0, t) for t in range(threads)]
    heapq.heapify(free)
    ends: list[int] = []
    last = [0] * threads
    for group in groups:
        at, thread = heapq.heappop(free)
        if at:
            ends.append(at)
        last[thread] = at + len(group)
        heapq.heappush(free, (last[thread], thread))
    return ends, last


def test_on_a_cluster_task_runs_are_staggered_so_their_set_ups_never_come_together() -> None:
    """A Dask worker pays Prefect's set-up of each task run (about a 100-row chunk's CPU,
    GIL held): up to 8 chunks a task run; and few threads end a group at the same time,
    or their successors' set-ups hold the worker's GIL together (even groups: all 10 at
    once), while the threads still finish the run together."""
    specs = _specs(200, rows=100)
    groups = chunk_groups(
        specs, to_send=lambda s: s.rows, chunk_size=100, parallel=10, per_run=CLUSTER_CHUNKS_PER_RUN
    )
    _check(groups, specs)
    assert all(len(g) <= CLUSTER_CHUNKS_PER_RUN for g in groups)
    assert len(groups) == 40
    sizes = [len(g) for g in groups]
    assert sizes[:10] == sorted(sizes[:10]) and sizes[-10:] == sorted(sizes[-10:], reverse=True)
    ends, last = _simulate(groups, 10)
    # 10 threads' offsets in steps of 0.65 of a chunk: at most 3 (of 2 workers) at once
    assert max(collections.Counter(ends).values()) <= 3
    assert max(last) - min(last) <= 2
    even, _ = _simulate(
        chunk_groups(
            specs,
            to_send=lambda s: s.rows,
            chunk_size=100,
            parallel=10,
            per_run=CLUSTER_CHUNKS_PER_RUN,
            max_groups=30,
        ),
        10,
    )
    assert max(collections.Counter(even).values()) == 10  # what staggering avoids


@pytest.mark.parametrize("seed", range(10))
def test_staggered_groups_keep_their_bounds(seed: int) -> None:
    rng = random.Random(seed)
    threads = rng.randint(2, 24)
    specs = _specs(rng.randint(2 * 8 * threads + 1, 3000), rows=100)
    sends = {s.index: rng.choice([100, 100, 60]) for s in specs}
    groups = chunk_groups(
        specs, to_send=lambda s: sends[s.index], chunk_size=100, parallel=threads, per_run=8
    )
    _check(groups, specs)
    assert all(sum(sends[s.index] for s in g) <= 9 * 100 for g in groups)  # a chunk over, at most
    _, last = _simulate(groups, threads)
    assert max(last) - min(last) <= 8


def test_a_small_run_on_a_cluster_is_one_wave_of_even_groups() -> None:
    specs = _specs(40, rows=100)
    groups = chunk_groups(specs, to_send=lambda s: s.rows, chunk_size=100, parallel=10, per_run=8)
    assert [len(g) for g in groups] == [4] * 10
    fewer = chunk_groups(
        specs[:8], to_send=lambda s: s.rows, chunk_size=100, parallel=10, per_run=8
    )
    assert fewer == [(s,) for s in specs[:8]]  # fewer chunks than threads: one each


def test_a_cluster_keeps_the_bound_on_task_runs_of_a_large_run() -> None:
    specs = _specs(10_000)
    groups = chunk_groups(specs, to_send=lambda s: s.rows, chunk_size=1000, parallel=12, per_run=8)
    _check(groups, specs)
    assert len(groups) == 910  # the MAX_GROUPS budget (11 chunks) is above 8 chunks


def test_task_run_names() -> None:
    assert group_name([4]) == "embed-chunk-0004"
    assert group_name([4, 5, 11]) == "embed-chunks-0004-0011"
    group = ChunkGroup(tuple(_specs(12)[4:12]))
    assert (group.first, group.last) == (4, 11)
