"""Chunk groups: how many chunks one chunk task run takes (docs/reference/prefect.md, "Chunk
groups").

A Prefect task run costs the flow, the client and the API server about as much as a chunk
with little to send; a night's task runs must grow with what it sends, not with the input.
So the chunks to dispatch are cut into *groups* of consecutive chunks (chunk order), one
task run each, which runs its chunks one after another; each chunk is still published and
recorded on its own. The rule (``chunk_groups``):

- a group takes chunks until its rows to send reach a budget: ``chunk_size`` rows, raised to
  ``total / (MAX_GROUPS - 1)`` when the run sends more than that. A chunk full of rows to
  send is a group of its own; chunks with a few rows each are packed by the hundred;
- so a run makes at most ``MAX_GROUPS`` groups (each group but the last reaches the budget);
- and at least ``parallel`` groups (the chunk tasks that run at once) when there are that
  many chunks: the heaviest group is halved until there are, so a small run runs in parallel.

On a Dask cluster a task run costs its worker more than a chunk's own work (Prefect rebuilds
its settings and its API client for each task run it hydrates there, holding the GIL), so
there a group may take up to ``per_run`` chunks' worth of rows (``CLUSTER_CHUNKS_PER_RUN``).
Groups of one size would end together on every thread of a worker, and their successors'
set-ups would then hold that worker's GIL at once, its request slots idle meanwhile. So a
run of two waves or more (of ``parallel`` groups of at most ``per_run`` chunks) is cut
*staggered* (``_staggered_budgets``): the first ``parallel`` groups grow from 1/``parallel``
of a whole group to a whole one (each thread starts on one and keeps that offset), then
whole groups, then the last ``parallel`` shrink back (the thread that started first, freed
first, takes the largest), so the threads still end together. 200 chunks on 10 threads:
40 task runs, the first of 1, 1, 2, 2, 4, ... 6 chunks, then 20 of 6 or 7, then 6, ... 1.
A run of one wave is cut into even groups: they end together only at the run's end.

Pure: no Prefect, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from embedline.models import ChunkOutcome, ChunkSpec

__all__ = [
    "CLUSTER_CHUNKS_PER_RUN",
    "MAX_GROUPS",
    "ChunkGroup",
    "GroupOutcome",
    "chunk_groups",
    "group_name",
]

#: Most chunk task runs one dispatch makes. Prefect's self-hosted server is reported
#: unsteady near 2,000 task runs per flow run and Prefect Cloud's entry tier takes 2,000
#: events a minute (a task run makes about three): 1,000 leaves room for the run's other task
#: runs and for a retry of each failed group. A 10M-row first run in 1,000-row chunks sends
#: 11 chunks per task run (910 task runs).
MAX_GROUPS = 1000

#: Most chunks' worth of rows a group takes on a Dask cluster (``per_run``). Measured on a
#: worker (py-spy): each task run spent about as long in Prefect's hydration of its context
#: (a new API client with its TLS context, the settings read again) as in its chunk at 100
#: rows; 8 chunks a task run leave that an eighth, and a lost worker's group is at most 8
#: chunks to rerun.
CLUSTER_CHUNKS_PER_RUN = 8


@dataclass(frozen=True, slots=True)
class ChunkGroup:
    """Consecutive chunks (chunk order) one chunk task run publishes, one after another.
    ``first``/``last``: the chunk indexes its task run's name shows."""

    specs: tuple[ChunkSpec, ...]

    @property
    def first(self) -> int:
        return self.specs[0].index

    @property
    def last(self) -> int:
        return self.specs[-1].index


@dataclass(frozen=True, slots=True, repr=False)
class GroupOutcome:
    """What a group's task run did, chunk by chunk (in ``ChunkGroup.specs`` order): the
    chunk's ``ChunkOutcome`` (published), the exception it failed with, or None (not
    started: the group stopped before it)."""

    outcomes: tuple[ChunkOutcome | BaseException | None, ...]

    def __repr__(self) -> str:
        """Counts only: Prefect logs a retried state with its result's repr."""
        published = sum(isinstance(o, ChunkOutcome) for o in self.outcomes)
        failed = len(self.failures())
        left = len(self.outcomes) - published - failed
        return f"GroupOutcome({published} published, {failed} failed, {left} not started)"

    def failures(self) -> list[BaseException]:
        """The chunks' exceptions, in chunk order."""
        return [o for o in self.outcomes if isinstance(o, BaseException)]


def group_name(indexes: Sequence[int]) -> str:
    """The task run name of a group of chunks ``indexes``: ``embed-chunk-0004`` for one
    chunk (the name a single chunk always had), ``embed-chunks-0004-0011`` for several."""
    if len(indexes) == 1:
        return f"embed-chunk-{indexes[0]:04d}"
    return f"embed-chunks-{indexes[0]:04d}-{indexes[-1]:04d}"


def chunk_groups(
    specs: Sequence[ChunkSpec],
    *,
    to_send: Callable[[ChunkSpec], int],
    chunk_size: int,
    parallel: int,
    max_groups: int = MAX_GROUPS,
    per_run: int = 1,
) -> list[tuple[ChunkSpec, ...]]:
    """Cut ``specs`` (in chunk order) into groups of consecutive chunks (module docstring).

    ``to_send(spec)``: the rows chunk ``spec`` sends (rows neither copied nor empty);
    ``chunk_size``: rows per chunk, the unit of a group's budget; ``parallel``: the chunk task
    runs that run at once; ``per_run``: most chunks' worth of rows a group takes (1:
    ``chunk_size`` rows, unless ``max_groups`` asks for more; ``CLUSTER_CHUNKS_PER_RUN`` on a
    Dask cluster, where a run of two waves or more is cut staggered). Returns at most
    ``max_groups`` groups and at least ``min(parallel, len(specs), max_groups)``; every spec in
    exactly one group, in order.
    """
    if not specs:
        return []
    weights = [max(1, to_send(s)) for s in specs]
    total = sum(weights)
    parallel = max(1, parallel)
    budgets = _staggered_budgets(total / chunk_size, parallel, per_run, max_groups)
    if budgets:
        groups = _cut_at(weights, [b * chunk_size for b in budgets])
    else:
        budget = max(
            chunk_size * _chunks_per_run(total / chunk_size, parallel, per_run),
            -(-total // max(1, max_groups - 1)),
        )
        groups = _cut_by(weights, budget)
    least = min(parallel, len(specs), max_groups)
    while len(groups) < least:
        _halve_heaviest(groups, weights)
    return [tuple(specs[p] for p in group) for group in groups]


def _cut_by(weights: list[int], budget: float) -> list[list[int]]:
    """Positions cut into groups that each take chunks until their weights reach
    ``budget`` (the last group takes what is left)."""
    groups: list[list[int]] = [[]]
    sent = 0
    for position, weight in enumerate(weights):
        if sent >= budget:
            groups.append([])
            sent = 0
        groups[-1].append(position)
        sent += weight
    return groups


def _cut_at(weights: list[int], budgets: list[float]) -> list[list[int]]:
    """Positions cut into groups of about ``budgets`` (rows each, in order): a chunk goes to
    the group whose share of the running total holds the chunk's middle, so rounding never
    drifts; a budget too small to hold a chunk's middle makes no group."""
    bounds = list(itertools.accumulate(budgets))
    groups: list[list[int]] = [[] for _ in bounds]
    sent, at = 0.0, 0
    for position, weight in enumerate(weights):
        middle = sent + weight / 2
        while at < len(bounds) - 1 and middle >= bounds[at]:
            at += 1
        groups[at].append(position)
        sent += weight
    return [group for group in groups if group]


def _staggered_budgets(
    chunks: float, parallel: int, per_run: int, max_groups: int
) -> list[float] | None:
    """The groups' budgets (chunks' worth, in dispatch order) of a staggered cut (module
    docstring), or None where the run is cut evenly: ``per_run`` 1 (threads), one wave (its
    groups end together only at the run's end), or more groups than ``max_groups``.

    With ``w`` the fewest waves of groups of at most ``per_run`` chunks and ``G`` the size
    of a whole group, thread ``k`` (0-based, of ``T`` = ``parallel``) runs a first group of
    ``G (k+1) / T``, ``w - 1`` whole ones and a last of ``G (T-k) / T``: ``G (w + 1/T)``
    chunks each, all of ``chunks`` over ``T`` threads."""
    waves = math.ceil(chunks / (parallel * per_run))
    if per_run <= 1 or waves < 2 or parallel * (waves + 1) > max_groups - 1:
        return None
    whole = chunks / parallel / (waves + 1 / parallel)
    if whole < 2:
        return None
    first = [whole * (k + 1) / parallel for k in range(parallel)]
    return [*first, *[whole] * (parallel * (waves - 1)), *reversed(first)]


def _chunks_per_run(chunks: float, parallel: int, per_run: int) -> int:
    """Chunks' worth of rows a group takes: the fewest waves of ``parallel`` groups of at
    most ``per_run`` chunks, then groups as even as those waves allow (``chunks``: the
    run's rows to send in chunks' worth)."""
    waves = max(1, math.ceil(chunks / (parallel * per_run)))
    return max(1, math.ceil(chunks / (parallel * waves)))


def _halve_heaviest(groups: list[list[int]], weights: list[int]) -> None:
    """Split the heaviest group of more than one chunk where its rows to send halve."""
    at = max(
        (n for n, g in enumerate(groups) if len(g) > 1),
        key=lambda n: (sum(weights[p] for p in groups[n]), len(groups[n])),
    )
    group = groups[at]
    half, sent, cut = sum(weights[p] for p in group) / 2, 0, 1
    for n, position in enumerate(group[:-1], start=1):
        sent += weights[position]
        cut = n
        if sent >= half:
            break
    groups[at : at + 1] = [group[:cut], group[cut:]]
