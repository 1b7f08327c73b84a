"""What the planning pass keeps of each row, in flat memory: id digests and text hashes.

Planning (``adapters.csv_source.plan_csv``) streams the input once. Two facts per row outlive
the pass, and both grow with the row count, so with a scratch directory
(``adapters.scratch``) they are spilled to disk in hash buckets instead of kept in lists:

- a 64-bit digest of every id (``id_digests``), for the duplicate-id check: ``suspects()``
  returns the digests seen twice, bucket by bucket (one bucket in memory at a time);
- for every non-empty text, the 64-bit prefix of its SHA-256 with its chunk index and its
  position in the chunk (``ROW_DTYPE``): the reuse stage joins them against the reuse index
  and finds in-run duplicates without reading the input again (``tasks/reuse/row_sources.py``);
- every row's id, text SHA-256, UTF-8 length, emptiness, kept-values hash and the physical
  lines its record starts and ends on, one Arrow record batch per chunk in ``chunks.arrow``
  (``chunk_rows``): a chunk whose every row the reuse stage copied is published from these
  without parsing the input a second time (``tasks/reuse/copied_chunk.py``); a delta night
  compares them with its base's (``tasks/plan/delta.py``), and its chunks parse only their
  own records, found by those lines (``adapters/csv_chunks.py``).

Without a scratch directory (tools and tests that only plan), the id digests stay in memory,
8 bytes a row, and nothing else is kept.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pyarrow as pa

from adapters.ledger.reuse_index import BUCKETS, bucket_of
from adapters.scratch import Scratch, Spill, hash_prefixes

__all__ = ["CHUNK_ROWS", "ROW_DTYPE", "RowFacts", "chunk_rows", "id_digests"]

#: One non-empty text of the input: its hash prefix, chunk index and position in the chunk.
ROW_DTYPE = np.dtype([("prefix", "<u8"), ("chunk", "<u4"), ("position", "<u4")])
#: The per-chunk rows file: batch i holds chunk i's rows in order.
CHUNK_ROWS = "chunks.arrow"
_CHUNK_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text_sha256", pa.string()),
        ("utf8_bytes", pa.int32()),
        ("empty", pa.bool_()),
        ("kept_sha256", pa.string()),  # null without kept columns
        ("line", pa.int64()),  # the physical lines where the record starts and ends
        ("last_line", pa.int64()),  # (null when not known: a chunk the reuse stage read)
    ]
)
_ID_SHIFT = np.uint64(64 - 6)


class RowFacts:
    """Collects the planning pass's per-row facts a chunk at a time (module docstring).

    ``add_chunk`` takes one chunk's rows; ``finish`` flushes. ``rows`` is the spill of text
    hashes (``ROW_DTYPE`` records, partitioned by reuse bucket), None without a scratch
    directory. Chunks come in order, 0, 1, 2, … (planning's order).
    """

    def __init__(self, scratch: Scratch | None) -> None:
        self._ids: list[np.ndarray] = []  # id digests kept in memory (no scratch directory)
        self.count = 0
        self._id_spill: Spill | None = None
        self.rows: Spill | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        if scratch is not None:
            self._id_spill = scratch.spill("ids", np.dtype("<u8"))
            self.rows = scratch.spill("rows", ROW_DTYPE)
            self._writer = pa.ipc.new_file(str(scratch.file(CHUNK_ROWS)), _CHUNK_SCHEMA)

    def add_chunk(
        self,
        chunk: int,
        ids: list[str],
        hashes: list[str],
        sizes: array[int],
        empties: list[int],
        kept: list[str] | None = None,
        lines: tuple[array[int], array[int]] | None = None,
    ) -> None:
        """Chunk ``chunk``'s rows, in order: their ids, texts' hex SHA-256s and UTF-8 sizes,
        the positions of the empty or whitespace-only texts (never reused nor sent), with
        kept columns each row's ``kept_sha256`` (a delta night compares them,
        ``tasks/plan/delta.py``) and, from planning, the physical lines where each record
        starts and ends (a delta chunk parses only its own records). The id digest of the
        duplicate check is computed here (``id_digests``)."""
        self.count += len(ids)
        digests = id_digests(ids)
        if self._writer is None:
            self._ids.append(digests)
            return
        assert self._id_spill is not None and self.rows is not None
        self._id_spill.add(digests.astype("<u8"), (digests >> _ID_SHIFT).astype(np.int64))
        text_hashes = pa.array(hashes, pa.string())
        empty = np.zeros(len(ids), dtype=bool)
        empty[empties] = True
        self._writer.write_batch(
            pa.record_batch(
                [
                    pa.array(ids, pa.string()),
                    text_hashes,
                    pa.array(_copied(sizes, np.int32)),
                    pa.array(empty),
                    pa.array(kept, pa.string()) if kept else pa.nulls(len(ids), pa.string()),
                    *(
                        (
                            pa.array(_copied(lines[0], np.int64)),
                            pa.array(_copied(lines[1], np.int64)),
                        )
                        if lines
                        else (pa.nulls(len(ids), pa.int64()),) * 2
                    ),
                ],
                schema=_CHUNK_SCHEMA,
            )
        )
        keep = ~empty
        records = np.empty(int(keep.sum()), dtype=ROW_DTYPE)
        records["prefix"] = hash_prefixes(text_hashes)[keep]
        records["chunk"] = chunk
        records["position"] = np.flatnonzero(keep)
        self.rows.add(records, bucket_of(records["prefix"]))

    def finish(self) -> None:
        """Write what is buffered (with a scratch directory)."""
        if self._writer is not None:
            assert self._id_spill is not None and self.rows is not None
            self._writer.close()
            self._writer = None
            self._id_spill.flush()
            self.rows.flush()

    def suspects(self) -> set[int]:
        """The id digests seen more than once (real duplicates, or rarely a collision of
        distinct ids: the caller confirms by reading the ids). Memory: one bucket."""
        if self._id_spill is None:
            return _repeated(
                np.concatenate(self._ids) if self._ids else np.zeros(0, dtype=np.uint64)
            )
        found: set[int] = set()
        for bucket in range(BUCKETS):
            found |= _repeated(self._id_spill.read(bucket))
            self._id_spill.drop(bucket)
        return found


def _copied(values: array[int], dtype: type[np.integer]) -> np.ndarray:
    """``values`` (an ``array.array`` of ``dtype``'s size) as a numpy array, copied from its
    buffer (no Python int per row; a copy, so the caller may clear ``values`` after)."""
    return np.frombuffer(values, dtype=dtype).copy() if len(values) else np.zeros(0, dtype)


def id_digests(ids: list[str]) -> np.ndarray:
    """A 64-bit digest of each id (``uint64``), for the duplicate check: Python's ``hash`` of
    the string, SipHash-1-3 under a key drawn per process (PEP 456), about 40 ns an id
    against about 700 ns for a BLAKE2b digest. Process-local: compare only digests made in
    the same process (the check recomputes them in the same ``plan_csv`` call) and never
    store one. A collision of distinct ids costs the second pass, which compares the ids."""
    return np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids)).view(np.uint64)


def _repeated(digests: np.ndarray) -> set[int]:
    if len(digests) < 2:
        return set()
    values, counts = np.unique(digests, return_counts=True)
    return {int(v) for v in values[counts > 1]}


def chunk_rows(scratch: str, chunk: int) -> pa.RecordBatch:
    """Chunk ``chunk``'s rows as planning read them (columns ``id``, ``text_sha256``,
    ``utf8_bytes``, ``empty``: an empty or whitespace-only text), from the plan's scratch
    directory ``scratch`` (memory-mapped).

    :raises FileNotFoundError: the scratch directory is gone.
    :raises IndexError: no such chunk.
    """
    with pa.memory_map(str(Path(scratch) / CHUNK_ROWS)) as source:
        return pa.ipc.open_file(source).get_batch(chunk)
