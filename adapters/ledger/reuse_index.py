"""The reuse index (``reuse_objects``, ``reuse_buckets``; docs/reference/ledger.md): which
chunk object holds a vector for which text, and at which row, by output URI, model and
requested dimensions.

Texts are keyed by the first 64 bits of their SHA-256 (``adapters.scratch.hash_prefix``)
and split into ``BUCKETS`` buckets by the top bits of that prefix. One row per (bucket,
object) holds the object's prefixes in that bucket and their row positions, as packed
``uint64``/``uint32`` arrays. A run looks its texts up bucket by bucket (``bucket``: every
indexed entry of one bucket for one output, model and dimensions; ``tasks/reuse/row_sources.py``
joins them with numpy), so a lookup costs a sorted search, not a B-tree probe per row, and
memory holds one bucket. A 64-bit prefix can collide: whoever takes a vector compares the
full ``text_sha256`` stored beside it in the object, so a collision costs a request, never a
wrong vector.

A cache of the store: rebuilt from the chunk objects' ``text_sha256`` columns when it misses
any (``tasks.reuse.row_sources.refresh_index``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adapters.ledger.base import LedgerBase, now_iso
from adapters.scratch import hash_prefixes

__all__ = ["BUCKETS", "ReuseIndex", "bucket_of"]

#: Buckets of the index and of a run's row hashes: the top 6 bits of the 64-bit prefix.
BUCKETS = 64
_SHIFT = np.uint64(64 - 6)


def bucket_of(prefixes: np.ndarray) -> np.ndarray:
    """The bucket (0..``BUCKETS``-1, int64) of each ``uint64`` hash prefix."""
    return (np.asarray(prefixes, dtype=np.uint64) >> _SHIFT).astype(np.int64)


def _bucket_rows(object_id: int, prefixes: np.ndarray) -> list[tuple[int, int, bytes, bytes]]:
    """``reuse_buckets`` rows of one object: (bucket, object id, prefixes, positions)."""
    positions = np.arange(len(prefixes), dtype="<u4")
    buckets = bucket_of(prefixes)
    order = np.argsort(buckets, kind="stable")
    cut = np.flatnonzero(np.diff(buckets[order])) + 1
    return [
        (
            int(buckets[part[0]]),
            object_id,
            prefixes[part].astype("<u8").tobytes(),
            positions[part].tobytes(),
        )
        for part in np.split(order, cut)
        if len(part)
    ]


class ReuseIndex(LedgerBase):
    """Index chunk objects' texts, read the index bucket by bucket, forget deleted objects."""

    def indexed_objects(self, output_uri: str) -> set[str]:
        """Return the object keys under ``output_uri`` that the reuse index covers."""
        rows = self._conn.execute(
            "SELECT object_key FROM reuse_objects WHERE output_uri = ?", (output_uri,)
        )
        return {r[0] for r in rows}

    def indexes_output(self, output_uri: str) -> bool:
        """Whether the reuse index covers any object under ``output_uri`` (one indexed row
        read: a first run, or a fresh ledger, has nothing to copy from)."""
        return (
            self._conn.execute(
                "SELECT 1 FROM reuse_objects WHERE output_uri = ? LIMIT 1", (output_uri,)
            ).fetchone()
            is not None
        )

    def index_object(
        self,
        output_uri: str,
        object_key: str,
        *,
        model: str,
        dimensions: str,
        text_hashes: Sequence[str],
    ) -> None:
        """Add a chunk object's texts (hex SHA-256s, in row order) to the reuse index,
        atomically: ``len(text_hashes)`` rows, row i at position i.

        ``dimensions`` is the requested dimensions as in the row key ("" when unset).
        Indexing an object twice (a concurrent run) changes nothing.
        """
        self.index_objects(output_uri, [(object_key, model, dimensions, text_hashes)])

    def index_objects(
        self, output_uri: str, objects: Sequence[tuple[str, str, str, Sequence[str]]]
    ) -> None:
        """``index_object`` for several ``(object key, model, dimensions, text hashes)`` in
        one transaction (a commit per object costs 11 ms: 2.2 s for 200 objects)."""
        with self.atomic() as db:
            for object_key, model, dimensions, text_hashes in objects:
                prefixes = hash_prefixes(text_hashes)
                row = db.execute(
                    """INSERT INTO reuse_objects (output_uri, object_key, model, dimensions,
                           rows, indexed_at) VALUES (?, ?, ?, ?, ?, ?)
                       ON CONFLICT (output_uri, object_key) DO NOTHING RETURNING object_id""",
                    (output_uri, object_key, model, dimensions, len(prefixes), now_iso()),
                ).fetchone()
                if row is not None:
                    db.executemany(
                        "INSERT INTO reuse_buckets VALUES (?, ?, ?, ?)",
                        _bucket_rows(row[0], prefixes),
                    )

    def forget_objects(self, output_uri: str, object_keys: Sequence[str]) -> None:
        """Drop objects (deleted from the store) from the reuse index."""
        with self.atomic() as db:
            for key in object_keys:
                row = db.execute(
                    "DELETE FROM reuse_objects WHERE output_uri = ? AND object_key = ? "
                    "RETURNING object_id",
                    (output_uri, key),
                ).fetchone()
                if row is not None:
                    db.execute("DELETE FROM reuse_buckets WHERE object_id = ?", (row[0],))

    def reuse_objects(self, output_uri: str, *, model: str, dimensions: str) -> dict[int, str]:
        """``{object id: object key}`` of the indexed objects of this output, model and
        requested dimensions ("" when unset), the ids ``bucket`` returns; newest first (the
        last indexed: ids grow as runs publish, and ``refresh_index`` indexes by age), the
        order in which the join prefers a text's sources."""
        rows = self._conn.execute(
            "SELECT object_id, object_key FROM reuse_objects WHERE output_uri = ? AND model = ?"
            " AND dimensions = ? ORDER BY object_id DESC",
            (output_uri, model, dimensions),
        )
        return dict(rows.fetchall())

    def bucket(
        self, bucket: int, object_ids: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every index entry of ``bucket`` in the objects ``object_ids``: three equal-length
        arrays, (prefixes ``uint64``, object ids ``int64``, row positions ``int64``), in no
        particular order. Memory: about 1/``BUCKETS`` of those objects' rows, 20 bytes each.
        """
        wanted = set(object_ids)
        with self._lock:
            rows = self._conn.execute(
                "SELECT object_id, prefixes, positions FROM reuse_buckets WHERE bucket = ?",
                (bucket,),
            ).fetchall()
        rows = [r for r in rows if r[0] in wanted]
        if not rows:
            empty = np.zeros(0, dtype=np.int64)
            return np.zeros(0, dtype=np.uint64), empty, empty
        prefixes = np.concatenate([np.frombuffer(r[1], dtype="<u8") for r in rows])
        positions = np.concatenate([np.frombuffer(r[2], dtype="<u4") for r in rows])
        owners = np.repeat(
            np.array([r[0] for r in rows], dtype=np.int64), [len(r[2]) // 4 for r in rows]
        )
        return prefixes.astype(np.uint64), owners, positions.astype(np.int64)
