"""The run's vector length, and the published chunks that disagree with it
(docs/reference/failure-classes.md, "The run's vector length"; docs/reference/output-layout.md:
every vector of a committed run has the manifest's ``dimensions``). No Prefect here: the flow,
``embedline run``'s commit without Prefect and ``commit_run`` use it.

The run's length is ``--dimensions`` when given (or the ``dimensions`` of the committed run
a generation supersedes); else the length of the first chunk this run publishes with
vectors the server sent (the first one seen: what the server answers now, not what an
older object holds); else, when the run sends nothing, the length most published rows have
(ties: the lowest chunk). The flow passes the length it knows to every chunk it submits
(chunk tasks on Dask workers share no memory), and until it knows one each chunk learns it
from its first answer. Published chunks of another length (an older night's objects, or
chunks that ran before the first answer was seen) are embedded again in the same run as
their next generation (``chunks/{key}.g{N}.parquet``,
docs/reference/output-layout.md, "Generations"); never committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq

from embedline.errors import BadResponseError
from embedline.models import ChunkOutcome
from embedline.protocols import ObjectStore
from tasks.commit.manifest import read_manifest
from tasks.publish.chunk_object import ChunkMetadata, read_chunk_metadata

__all__ = [
    "RunLength",
    "checked_dimensions",
    "other_lengths",
    "other_lengths_message",
    "pinned_length",
    "run_length",
    "with_lengths",
]

_READ_THREADS = 16


def with_lengths(
    store: ObjectStore, outcomes: Mapping[int, ChunkOutcome]
) -> dict[int, ChunkOutcome]:
    """``outcomes`` with ``dimensions``, ``rows_sent`` and ``rows_xor`` filled in from each
    non-empty object's Parquet footer where the outcome does not say (a chunk the ledger
    knew): one ranged read per such object, 16 at a time. An object gone from the store is
    left as it is (``missing_objects`` reports it)."""
    todo = [o for o in outcomes.values() if o.rows and (o.dimensions is None or o.rows_xor is None)]
    with ThreadPoolExecutor(_READ_THREADS) as pool:
        read = list(pool.map(lambda o: _footer(store, o.object_key), todo))
    filled = dict(outcomes)
    for outcome, found in zip(todo, read, strict=True):
        if found is not None:
            filled[outcome.index] = replace(
                outcome,
                dimensions=found.dimensions,
                rows_sent=found.rows_sent,
                rows_xor=found.rows_xor,
            )
    return filled


def _footer(store: ObjectStore, key: str) -> ChunkMetadata | None:
    try:
        with store.open_read(key) as fh:
            return read_chunk_metadata(pq.ParquetFile(fh).schema_arrow)
    except (FileNotFoundError, ValueError, pa.ArrowException):
        return None


class RunLength:
    """The run's vector length as its chunks are published (see the module docstring).

    ``current()`` is what the flow tells each chunk it submits: ``pinned``, else the
    length of this run's first chunk whose vectors the server sent (``first_seen``), else
    None. ``decide(outcomes)`` is the length the run commits at: the same, else (nothing
    sent in this run) the length most of the published rows have. O(outcomes) each.
    """

    def __init__(self, pinned: int | None = None) -> None:
        self.pinned = pinned
        self.first_seen: int | None = None

    def answered(self, outcomes: Iterable[ChunkOutcome]) -> None:
        """Note this run's published outcomes, in the order they arrived."""
        if self.first_seen is not None:
            return
        for o in outcomes:
            if o.rows and o.rows_sent and o.dimensions is not None:
                self.first_seen = o.dimensions
                return

    def current(self) -> int | None:
        """The length every chunk submitted now must have, or None while unknown."""
        return self.pinned or self.first_seen

    def decide(self, outcomes: Iterable[ChunkOutcome]) -> int | None:
        """The run's length given all its published chunks (None: every chunk empty)."""
        known = self.current()
        if known is not None:
            return known
        rows: dict[int, tuple[int, int]] = {}  # length → (rows, -lowest chunk index)
        for o in outcomes:
            if o.rows and o.dimensions is not None:
                count, first = rows.get(o.dimensions, (0, -o.index))
                rows[o.dimensions] = (count + o.rows, max(first, -o.index))
        return max(rows, key=lambda length: rows[length]) if rows else None

    def refusal(self, done: Mapping[int, ChunkOutcome]) -> str | None:
        """Why the published chunks ``done`` (lengths filled in) cannot be committed
        together (``other_lengths_message``), or None when they can."""
        target = self.decide(done.values())
        off = other_lengths(done, target)
        return other_lengths_message(done, off, target or 0) if off else None


def run_length(outcomes: Iterable[ChunkOutcome], pinned: int | None) -> int | None:
    """The length a run of these published chunks commits at, nothing sent (``decide``)."""
    return RunLength(pinned).decide(outcomes)


def pinned_length(store: ObjectStore, dimensions: int | None, supersedes: str | None) -> int | None:
    """``--dimensions``, else the ``dimensions`` of the committed run a generation supersedes
    (its manifest, one GET), else None."""
    if dimensions or not supersedes:
        return dimensions
    manifest = read_manifest(store, supersedes)
    if manifest is None:
        return None
    return int(str(manifest["dimensions"])) or None


def other_lengths(outcomes: Mapping[int, ChunkOutcome], length: int | None) -> list[int]:
    """Indexes of the non-empty chunks whose vectors are not ``length`` long (sorted)."""
    if length is None:
        return []
    return sorted(
        i
        for i, o in outcomes.items()
        if o.rows and o.dimensions is not None and o.dimensions != length
    )


def other_lengths_message(outcomes: Mapping[int, ChunkOutcome], off: list[int], length: int) -> str:
    """One line for a run that cannot commit because chunks ``off`` have another length."""
    first = outcomes[off[0]]
    more = f" (and {len(off) - 1} more)" if len(off) > 1 else ""
    return (
        f"chunk {off[0]}{more} holds vectors of {first.dimensions} dimensions, the run's "
        f"are {length}: the server changed the length of its answers during the run; "
        "nothing committed. Rerun the same command to embed those chunks again at "
        f"{length}, or pass --dimensions to pin one length"
    )


def checked_dimensions(
    store: ObjectStore, outcomes: Mapping[int, ChunkOutcome], pinned: int | None
) -> int | None:
    """The last line of defence before a manifest is written: the one length every
    non-empty chunk object listed has (read from the footers the outcomes do not give), or
    None when every chunk is empty.

    :raises BadResponseError: the objects hold vectors of different lengths, or of another
        length than ``pinned`` (``--dimensions``).
    """
    filled = with_lengths(store, outcomes)
    lengths = {o.dimensions for o in filled.values() if o.rows and o.dimensions is not None}
    if pinned:
        lengths.add(pinned)
    if len(lengths) > 1:
        raise BadResponseError(
            f"refusing to commit: the run's chunk objects hold vectors of {sorted(lengths)} "
            "dimensions; a manifest lists one length"
        )
    return lengths.pop() if lengths else None
