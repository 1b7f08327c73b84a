"""What the planning pass keeps of each row, in flat memory: id digests and text hashes.

Planning (``adapters.csv_source.plan_csv``) streams the input once. Two facts per row outlive
the pass, and both grow with the row count, so with a scratch directory
(``adapters.scratch``) they are spilled to disk in hash buckets instead of kept in lists:

- a 64-bit digest of every id (BLAKE2b), for the duplicate-id check: ``suspects()``
  returns the digests seen twice, bucket by bucket (one bucket in memory at a time);
- for every non-empty text, the 64-bit prefix of its SHA-256 with its chunk index and its
  position in the chunk (``ROW_DTYPE``): the reuse stage joins them against the reuse index
  and finds in-run duplicates without reading the input again (``tasks/reuse_plan.py``);
- every row's id, text SHA-256, UTF-8 length and emptiness, one Arrow record batch per chunk in
  ``chunks.arrow`` (``chunk_rows``): a chunk whose every row the reuse stage copied is
  published from these without parsing the input a second time (``tasks/copied.py``).

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

__all__ = ["CHUNK_ROWS", "ROW_DTYPE", "RowFacts", "chunk_rows"]

#: One non-empty text of the input: its hash prefix, chunk index and position in the chunk.
ROW_DTYPE = np.dtype([("prefix", "<u8"), ("chunk", "<u4"), ("position", "<u4")])
_FLUSH_ROWS = 1 << 16
#: The per-chunk rows file: batch i holds chunk i's rows in order.
CHUNK_ROWS = "chunks.arrow"
_CHUNK_SCHEMA = pa.schema([("id", pa.string()), ("text_sha256", pa.string()),
                           ("utf8_bytes", pa.int32()), ("empty", pa.bool_())])
_ID_SHIFT = np.uint64(64 - 6)


class RowFacts:
    """Collects the planning pass's per-row facts (see the module docstring).

    ``add`` takes one row; ``finish`` flushes. ``rows`` is the spill of text hashes
    (``ROW_DTYPE`` records, partitioned by reuse bucket), None without a scratch directory.
    Rows come chunk by chunk, in order (planning's order).
    """

    def __init__(self, scratch: Scratch | None) -> None:
        self._ids: array[int] = array("Q")
        self.count = 0
        self._id_spill: Spill | None = None
        self.rows: Spill | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._chunk = 0  # the chunk whose rows are being collected
        self._row_ids: list[str] = []
        self._row_hashes: list[str] = []
        self._row_bytes: array[int] = array("i")
        self._row_empties: list[int] = []  # positions of the chunk's empty texts
        if scratch is not None:
            self._id_spill = scratch.spill("ids", np.dtype("<u8"))
            self.rows = scratch.spill("rows", ROW_DTYPE)
            self._writer = pa.ipc.new_file(str(scratch.file(CHUNK_ROWS)), _CHUNK_SCHEMA)

    def add(self, id_digest: int, row_id: str, utf8_bytes: int, text_hash: str,
            nonempty: bool, chunk: int) -> None:
        """One row: its id's 64-bit digest and the id, its text's size in UTF-8 bytes and
        hex SHA-256, whether it is non-empty (an empty text is never reused nor sent) and
        its chunk index (rows come in order: its position is the count of the chunk's rows
        so far)."""
        self.count += 1
        self._ids.append(id_digest)
        if self._writer is None:
            return
        if chunk != self._chunk:
            self._close_chunk()
            self._chunk = chunk
        if not nonempty:
            self._row_empties.append(len(self._row_ids))
        self._row_ids.append(row_id)
        self._row_hashes.append(text_hash)
        self._row_bytes.append(utf8_bytes)
        if len(self._ids) >= _FLUSH_ROWS:
            self._flush_ids()

    def finish(self) -> None:
        """Write what is buffered (with a scratch directory)."""
        if self._writer is not None:
            self._close_chunk()
            self._writer.close()
            self._writer = None
            self._flush_ids()
            assert self.rows is not None
            self.rows.flush()

    def _close_chunk(self) -> None:
        """Write the chunk's rows (one record batch) and its non-empty texts' hash records
        (``ROW_DTYPE``, vectorized)."""
        assert self._writer is not None and self.rows is not None
        if not self._row_ids:
            return
        hashes = pa.array(self._row_hashes, pa.string())
        empty = np.zeros(len(self._row_ids), dtype=bool)
        empty[self._row_empties] = True
        self._writer.write_batch(pa.record_batch(
            [pa.array(self._row_ids, pa.string()), hashes, pa.array(self._row_bytes, pa.int32()),
             pa.array(empty)], schema=_CHUNK_SCHEMA))
        keep = ~empty
        records = np.empty(int(keep.sum()), dtype=ROW_DTYPE)
        records["prefix"] = hash_prefixes(hashes)[keep]
        records["chunk"] = self._chunk
        records["position"] = np.flatnonzero(keep)
        self.rows.add(records, bucket_of(records["prefix"]))
        self._row_ids, self._row_hashes, self._row_bytes = [], [], array("i")
        self._row_empties = []

    def _flush_ids(self) -> None:
        assert self._id_spill is not None
        ids = np.frombuffer(self._ids, dtype=np.uint64)
        self._id_spill.add(ids.astype("<u8"), (ids >> _ID_SHIFT).astype(np.int64))
        self._ids = array("Q")
        self._id_spill.flush()

    def suspects(self) -> set[int]:
        """The id digests seen more than once (real duplicates, or rarely a collision of
        distinct ids: the caller confirms by reading the ids). Memory: one bucket."""
        if self._id_spill is None:
            return _repeated(np.frombuffer(self._ids, dtype=np.uint64))
        found: set[int] = set()
        for bucket in range(BUCKETS):
            found |= _repeated(self._id_spill.read(bucket))
            self._id_spill.drop(bucket)
        return found


def _repeated(digests: np.ndarray) -> set[int]:
    if len(digests) < 2:
        return set()
    values, counts = np.unique(digests, return_counts=True)
    return {int(v) for v in values[counts > 1]}


def chunk_rows(scratch: str, chunk: int) -> pa.RecordBatch:
    """Chunk ``chunk``'s rows as planning read them (columns ``id``, ``text_sha256``,
    ``utf8_bytes``, ``empty``: an empty or whitespace-only text), from the plan's scratch directory ``scratch`` (memory-mapped).

    :raises FileNotFoundError: the scratch directory is gone.
    :raises IndexError: no such chunk.
    """
    with pa.memory_map(str(Path(scratch) / CHUNK_ROWS)) as source:
        return pa.ipc.open_file(source).get_batch(chunk)
