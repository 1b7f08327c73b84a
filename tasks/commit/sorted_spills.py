"""Sorting key tables by ``id`` in bounded memory: sorted runs in a scratch directory, merged
in id-aligned blocks (what grows with the row count lives on disk).

``write_runs`` takes tables in any order (ids unique within one source) and writes *sorted
runs*: up to ``SortLimits.run_rows`` rows (fewer once their Arrow buffers reach
``run_bytes``) sorted by ``id`` in memory and written as one Arrow IPC stream of small
batches (``batch_rows``, fewer once a batch would pass ``batch_bytes``).

``merge_blocks`` reads the runs of several sources (a change set's two sides) a few batches
at a time and yields *blocks* in ascending id order. Each step tops every run's buffer up to
at least one batch, takes the *cutoff*, the smallest last id among the buffers of runs with
unread batches, and moves every buffered row whose id is at most the cutoff into the block.
A run's unread rows all sort after its buffer's last id, which is at least the cutoff, so
every row with an id up to the cutoff, of every source, is in the block: an id present in
two sources is always in the same block on both sides. Steps are gathered into blocks of at
least ``fan_in * batch_rows`` rows (fewer for the last one).

With more runs than ``fan_in``, ``reduce_runs`` first merges the smallest runs of one source
into one (a second pass over those rows), so the buffers stay small whatever the row count.
Rows held at once, at most (counted in ``SortStats``):

- forming a run: ``run_rows`` plus the rows of the table that reached it, twice while the
  run is sorted (the parts and their combined copy);
- merging: ``2 * batch_rows`` per run, ``fan_in`` runs, plus a block of ``fan_in *
  batch_rows`` being gathered: ``SortLimits.merge_rows``.

Order: Arrow's ``sort_indices`` on strings, which is UTF-8 byte order; that is code point
order, so the cutoff compares Python ``str`` values and agrees with it.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["SortLimits", "SortStats", "SortedRun", "merge_blocks", "reduce_runs", "write_runs"]

_SORT_KEY = [("id", "ascending")]


@dataclass(frozen=True, slots=True)
class SortLimits:
    """How much of a sort is held in memory. Defaults: 16 MiB of rows while forming a run
    (twice that while it is sorted) and at most 8 MiB of run buffers plus a 4 MiB block
    while merging, for rows of about 80 bytes (a short id and a hex SHA-256). Measured on
    10 million rows a side: 36 MiB of Arrow memory at most (benchmarks/bench_changes.py);
    smaller runs or batches cost more merge passes or more steps for little less memory."""

    run_rows: int = 1 << 20  # rows sorted in memory per run, at most
    run_bytes: int = 16 << 20  # ... or fewer, once their Arrow buffers hold this many bytes
    batch_rows: int = 1024  # rows per IPC batch of a run, at most
    batch_bytes: int = 64 << 10  # ... or fewer, so a batch stays near this many bytes
    fan_in: int = 64  # runs merged at once; more runs → a merge pass over the smallest first

    def __post_init__(self) -> None:
        if min(self.run_rows, self.run_bytes, self.batch_rows, self.batch_bytes) < 1:
            raise ValueError(f"sort limits must be positive: {self}")
        if self.fan_in < 2:
            raise ValueError(f"fan_in must be at least 2, not {self.fan_in}")

    @property
    def block_rows(self) -> int:
        """Rows a block gathers before ``merge_blocks`` yields it (the last may hold fewer)."""
        return self.fan_in * self.batch_rows

    @property
    def merge_rows(self) -> int:
        """The most rows ``merge_blocks`` holds at once: run buffers and the block gathered."""
        return 3 * self.fan_in * self.batch_rows


@dataclass(slots=True)
class SortStats:
    """What a sort did, counted as it went (read by tests and benchmarks)."""

    runs: int = 0  # sorted runs written from the input
    merged_runs: int = 0  # runs written by ``reduce_runs`` (a second pass over their rows)
    blocks: int = 0  # blocks ``merge_blocks`` yielded
    peak_run_rows: int = 0  # most rows held while forming one run
    peak_merge_rows: int = 0  # most rows held by ``merge_blocks`` (buffers + gathered block)


@dataclass(frozen=True, slots=True)
class SortedRun:
    """One sorted run: an Arrow IPC stream file of ``rows`` rows sorted by ``id``, in
    batches of at most ``batch_rows`` rows."""

    path: Path
    rows: int
    batch_rows: int


def _batch_rows(table: pa.Table, limits: SortLimits) -> int:
    """Rows per IPC batch for a run like ``table``: ``batch_rows``, fewer for wide rows."""
    per_row: int = max(1, table.nbytes // max(1, table.num_rows))
    return max(1, min(limits.batch_rows, limits.batch_bytes // per_row))


class _RunWriter:
    """Writes one run's rows, already in id order, as IPC batches of ``batch_rows``; a
    context manager that closes the file (also on error: the caller's directory goes)."""

    def __init__(self, path: Path, schema: pa.Schema, batch_rows: int) -> None:
        self.path, self.batch_rows, self.rows = path, batch_rows, 0
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def __enter__(self) -> _RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._writer.close()
        finally:
            self._sink.close()

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table, max_chunksize=self.batch_rows)
        self.rows += table.num_rows

    def run(self) -> SortedRun:
        """The run written (after the ``with`` block)."""
        return SortedRun(self.path, self.rows, self.batch_rows)


def _spill(parts: list[pa.Table], path: Path, limits: SortLimits) -> SortedRun:
    """Sort ``parts`` (emptied) by id and write them to ``path`` as one run."""
    combined = pa.concat_tables(parts).combine_chunks()
    parts.clear()
    order = pc.sort_indices(combined, sort_keys=_SORT_KEY)
    with _RunWriter(path, combined.schema, _batch_rows(combined, limits)) as writer:
        for start in range(0, combined.num_rows, writer.batch_rows):
            writer.write(combined.take(order.slice(start, writer.batch_rows)))
    return writer.run()


def write_runs(
    tables: Iterable[pa.Table],
    directory: Path,
    *,
    name: str,
    limits: SortLimits,
    stats: SortStats,
) -> list[SortedRun]:
    """Write ``tables`` (each of one schema with a string ``id``; ids unique across them) as
    sorted runs ``{directory}/{name}-{n:06d}.arrow``; return them (``[]`` for no rows).

    Holds ``limits.run_rows`` rows (or ``run_bytes``) plus one table at most, twice while
    a run is sorted. :raises OSError: the scratch directory is full or not writable.
    """
    runs: list[SortedRun] = []
    parts: list[pa.Table] = []
    rows = nbytes = 0
    for table in tables:
        if not table.num_rows:
            continue
        parts.append(table)
        rows, nbytes = rows + table.num_rows, nbytes + table.nbytes
        stats.peak_run_rows = max(stats.peak_run_rows, rows)
        if rows >= limits.run_rows or nbytes >= limits.run_bytes:
            runs.append(_spill(parts, directory / f"{name}-{len(runs):06d}.arrow", limits))
            rows = nbytes = 0
    if parts:
        runs.append(_spill(parts, directory / f"{name}-{len(runs):06d}.arrow", limits))
    stats.runs += len(runs)
    return runs


class _Ids:
    """A sorted string column seen as a sequence of ``str``, for ``bisect``."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self._column = column

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, index: int) -> str:
        return str(self._column[index].as_py())


class _Cursor:
    """One run read a few batches at a time. ``buffer`` holds its next rows (sorted);
    ``more`` is False once every batch is read; ``last`` is the buffer's largest id."""

    def __init__(self, run: SortedRun, schema: pa.Schema) -> None:
        self._want = run.batch_rows
        self._empty = pa.Table.from_batches([], schema=schema)
        self._file = pa.OSFile(str(run.path))
        self._reader: pa.ipc.RecordBatchStreamReader | None = pa.ipc.open_stream(self._file)
        self.buffer = self._empty
        self.more = True
        self.last = ""
        self.fill()

    def fill(self) -> None:
        """Read batches until the buffer holds at least one batch's rows (fewer than two)."""
        parts = [self.buffer] if self.buffer.num_rows else []
        rows = self.buffer.num_rows
        while self._reader is not None and rows < self._want:
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                self.close()
                break
            parts.append(pa.Table.from_batches([batch]))
            rows += batch.num_rows
        if rows > self.buffer.num_rows:
            self.buffer = pa.concat_tables(parts)
            self.last = str(self.buffer.column("id")[rows - 1].as_py())

    def take_through(self, cutoff: str | None) -> pa.Table:
        """Remove and return the buffered rows whose id is at most ``cutoff`` (all: None)."""
        rows = self.buffer.num_rows
        if cutoff is None or (rows and self.last <= cutoff):
            taken, self.buffer = self.buffer, self._empty  # the batches go with the rows
            return taken
        count = bisect.bisect_right(_Ids(self.buffer.column("id")), cutoff)
        taken, self.buffer = self.buffer.slice(0, count), self.buffer.slice(count)
        return taken

    def close(self) -> None:
        """Close the file; no batch is read after this."""
        self.more = False
        self._reader = None
        self._file.close()


def merge_blocks(
    sources: Sequence[Sequence[SortedRun]],
    schema: pa.Schema,
    *,
    limits: SortLimits,
    stats: SortStats,
) -> Iterator[list[pa.Table]]:
    """Yield blocks in ascending id order, each a list of one table per source (of
    ``schema``, possibly 0 rows) holding that source's rows whose ids fall in the block's
    range: the ranges are consecutive and every row is in exactly one block. Rows within a
    block's table are not in id order (each run's rows are; runs interleave).

    Reads at most ``limits.fan_in`` runs' worth of buffers at once (``reduce_runs`` first
    when there are more); holds at most ``limits.merge_rows`` rows (``stats.peak_merge_rows``).
    """
    if sum(len(runs) for runs in sources) > limits.fan_in:
        raise ValueError(f"more than fan_in {limits.fan_in} runs: reduce_runs first")
    cursors: list[list[_Cursor]] = []
    try:
        for runs in sources:  # opened one by one, so a failure closes those already open
            cursors.append([])
            for run in runs:
                cursors[-1].append(_Cursor(run, schema))
        yield from _blocks(cursors, schema, limits, stats)
    finally:
        for cursor in itertools.chain.from_iterable(cursors):
            cursor.close()


def _blocks(
    cursors: list[list[_Cursor]], schema: pa.Schema, limits: SortLimits, stats: SortStats
) -> Iterator[list[pa.Table]]:
    gathered: list[list[pa.Table]] = [[] for _ in cursors]
    gathered_rows = 0
    every = list(itertools.chain.from_iterable(cursors))
    while any(c.buffer.num_rows for c in every):
        buffered = sum(c.buffer.num_rows for c in every)
        stats.peak_merge_rows = max(stats.peak_merge_rows, buffered + gathered_rows)
        bounds = [c.last for c in every if c.more]
        cutoff = min(bounds) if bounds else None  # None: every run is in its buffer
        for side, runs in zip(gathered, cursors, strict=True):
            for cursor in runs:
                taken = cursor.take_through(cutoff)
                if taken.num_rows:
                    side.append(taken)
                    gathered_rows += taken.num_rows
        if gathered_rows >= limits.block_rows:
            yield _block(gathered, schema, stats)
            gathered_rows = 0
        for cursor in every:
            cursor.fill()
    if gathered_rows:
        yield _block(gathered, schema, stats)


def _block(gathered: list[list[pa.Table]], schema: pa.Schema, stats: SortStats) -> list[pa.Table]:
    """One table per source from the gathered pieces (emptied)."""
    stats.blocks += 1
    block = [
        pa.concat_tables(side) if side else pa.Table.from_batches([], schema=schema)
        for side in gathered
    ]
    for side in gathered:
        side.clear()
    return block


def reduce_runs(
    sources: Sequence[Sequence[SortedRun]],
    schema: pa.Schema,
    directory: Path,
    *,
    limits: SortLimits,
    stats: SortStats,
) -> list[list[SortedRun]]:
    """Return ``sources`` with at most ``limits.fan_in`` runs in all: while there are more,
    merge the smallest runs of the source holding the most runs into one run (as few as
    bring the total down, at most ``fan_in``), deleting the runs merged.

    :raises ValueError: more sources than ``limits.fan_in`` (each keeps one run at least).
    :raises OSError: the scratch directory is full or not writable.
    """
    if len(sources) > limits.fan_in:
        raise ValueError(f"{len(sources)} sources cannot merge with fan_in {limits.fan_in}")
    result = [sorted(runs, key=lambda r: r.rows) for runs in sources]
    while (total := sum(len(runs) for runs in result)) > limits.fan_in:
        runs = max(result, key=len)
        count = min(limits.fan_in, total - limits.fan_in + 1, len(runs))
        group, rest = runs[:count], runs[count:]
        merged = _merge_into_one(
            group, schema, directory / f"merged-{stats.merged_runs:06d}.arrow", limits, stats
        )
        for run in group:
            with contextlib.suppress(FileNotFoundError):
                run.path.unlink()
        runs[:] = sorted([*rest, merged], key=lambda r: r.rows)
    return result


def _merge_into_one(
    group: Sequence[SortedRun], schema: pa.Schema, path: Path, limits: SortLimits, stats: SortStats
) -> SortedRun:
    """Merge the runs of ``group`` (one source, at most ``fan_in``) into one run at ``path``."""
    with _RunWriter(path, schema, min(run.batch_rows for run in group)) as writer:
        for (block,) in merge_blocks([group], schema, limits=limits, stats=stats):
            writer.write(block.sort_by(_SORT_KEY))
    stats.merged_runs += 1
    return writer.run()
