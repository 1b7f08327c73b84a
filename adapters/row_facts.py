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
from adapters.scratch import Scratch, Spill

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
        self._prefixes: array[int] = array("Q")
        self._chunks: array[int] = array("I")
        self._positions: array[int] = array("I")
        self.count = 0
        self._id_spill: Spill | None = None
        self.rows: Spill | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._chunk = 0  # the chunk whose rows are being collected
        self._row_ids: list[str] = []
        self._row_hashes: list[str] = []
        self._row_bytes: array[int] = array("i")
        self._row_empty: list[bool] = []
        if scratch is not None:
            self._id_spill = scratch.spill("ids", np.dtype("<u8"))
            self.rows = scratch.spill("rows", ROW_DTYPE)
            self._writer = pa.ipc.new_file(str(scratch.file(CHUNK_ROWS)), _CHUNK_SCHEMA)

    def add(self, id_digest: int, row_id: str, text: str, text_hash: str, nonempty: bool,
            chunk: int, position: int) -> None:
        """One row: its id's 64-bit digest and the id, its text, the text's hex SHA-256,
        whether it is non-empty (an empty text is never reused nor sent), its chunk index
        and 0-based position in the chunk."""
        self.count += 1
        self._ids.append(id_digest)
        if self._writer is None:
            return
        if chunk != self._chunk:
            self._close_chunk()
            self._chunk = chunk
        self._row_ids.append(row_id)
        self._row_hashes.append(text_hash)
        self._row_bytes.append(len(text.encode("utf-8")))
        self._row_empty.append(not nonempty)
        if nonempty:
            self._prefixes.append(int(text_hash[:16], 16))
            self._chunks.append(chunk)
            self._positions.append(position)
        if len(self._ids) >= _FLUSH_ROWS:
            self._flush()

    def finish(self) -> None:
        """Write what is buffered (with a scratch directory)."""
        if self._writer is not None:
            self._close_chunk()
            self._writer.close()
            self._writer = None
            self._flush()

    def _close_chunk(self) -> None:
        assert self._writer is not None
        if not self._row_ids:
            return
        self._writer.write_batch(pa.record_batch(
            [pa.array(self._row_ids, pa.string()), pa.array(self._row_hashes, pa.string()),
             pa.array(self._row_bytes, pa.int32()), pa.array(self._row_empty, pa.bool_())],
            schema=_CHUNK_SCHEMA))
        self._row_ids, self._row_hashes, self._row_bytes = [], [], array("i")
        self._row_empty = []

    def _flush(self) -> None:
        assert self._id_spill is not None and self.rows is not None
        ids = np.frombuffer(self._ids, dtype=np.uint64)
        self._id_spill.add(ids.astype("<u8"), (ids >> _ID_SHIFT).astype(np.int64))
        self._ids = array("Q")
        if self._prefixes:
            records = np.empty(len(self._prefixes), dtype=ROW_DTYPE)
            records["prefix"] = np.frombuffer(self._prefixes, dtype=np.uint64)
            records["chunk"] = np.frombuffer(self._chunks, dtype=np.uint32)
            records["position"] = np.frombuffer(self._positions, dtype=np.uint32)
            self.rows.add(records, bucket_of(records["prefix"]))
            self._prefixes, self._chunks, self._positions = array("Q"), array("I"), array("I")
        self._id_spill.flush()
        self.rows.flush()

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
