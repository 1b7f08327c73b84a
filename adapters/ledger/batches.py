"""The ``batches`` table (migration ``0007_batches``): the Batch API batches of each run.

One row per (run key, chunk index, part). A part is written ``creating`` before its input
file is uploaded and its batch created, and ``submitted`` with the provider's batch id
after; its provider ``status``, file ids and request counts follow each poll. A part whose
row is still ``creating`` (a crash, a create that failed or timed out) is looked up in the
account's batch list (the batch made from its upload) before anything is submitted again.
``layout`` (migration ``0010_batch_layouts``) is what the part carries: each request's
``custom_id`` and the positions of its rows in the chunk, recorded before the create and
never derived again from the run's settings (a rerun may change them); NULL for a part
recorded before that migration. ``req_start`` / ``req_stop`` is the part's range of the
chunk's requests as first planned (``tasks.batch.requests``), NULL for a part that submits
what earlier parts left unanswered. One batch packs the parts of many chunks (migration
``0013_packed_batches``): its parts share its ``batch_id`` and ``input_file_id``, each
keeps its own ``requests``, ``inputs`` and ``layout``, and each poll writes the batch's
``status``, files and counts (``completed``, ``failed``: the whole batch's) on all of them.
Ids, counts, row positions and error messages of the provider only: never text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from adapters.ledger.base import LedgerBase, now_iso
from embedline.models import BatchLayout

__all__ = ["BatchRecord", "BatchTable"]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A ``batches`` row (requests and inputs of the part; counts as the provider says)."""

    run_key: str
    idx: int
    part: int
    chunk_key: str
    req_start: int | None
    req_stop: int | None
    state: str
    batch_id: str | None
    status: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    requests: int
    inputs: int
    completed: int
    failed: int
    error: str | None
    layout: BatchLayout | None = None  # None: recorded before 0010_batch_layouts


class BatchTable(LedgerBase):
    """The ledger's record of batches submitted to a Batch API."""

    def add_batch_parts(
        self,
        run_key: str,
        idx: int,
        chunk_key: str,
        parts: list[tuple[int, int | None, int | None, BatchLayout]],
    ) -> None:
        """Record parts ``(part, req_start, req_stop, layout)`` of chunk ``idx`` as
        ``creating``, with the requests each carries (``layout``; its requests and inputs
        counted from it), in one transaction (parts already recorded are kept)."""
        now = now_iso()
        with self.atomic() as db:
            db.executemany(
                """INSERT INTO batches (run_key, idx, part, chunk_key, req_start, req_stop,
                   state, requests, inputs, layout, created_at, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, 'creating', ?, ?, ?, ?, ?)
                   ON CONFLICT (run_key, idx, part) DO NOTHING""",
                [
                    (
                        run_key,
                        idx,
                        part,
                        chunk_key,
                        start,
                        stop,
                        len(layout),
                        sum(len(rows) for _, rows in layout),
                        json.dumps([[c, list(rows)] for c, rows in layout], separators=(",", ":")),
                        now,
                        now,
                    )
                    for part, start, stop, layout in parts
                ],
            )

    def mark_batch_submitted(
        self,
        run_key: str,
        idx: int,
        part: int,
        *,
        batch_id: str,
        input_file_id: str | None,
        status: str,
    ) -> None:
        """Record the provider's id of part ``part`` (created, or adopted from the list)."""
        with self._lock:
            self._conn.execute(
                """UPDATE batches SET state = 'submitted', batch_id = ?, input_file_id = ?,
                   status = ?, updated_at = ? WHERE run_key = ? AND idx = ? AND part = ?""",
                (batch_id, input_file_id, status, now_iso(), run_key, idx, part),
            )

    def note_batch_input(
        self, run_key: str, idx: int, part: int, input_file_id: str | None
    ) -> None:
        """Record the uploaded input file of a part still ``creating`` (None: forget it, a
        create refused it and the part goes in another batch)."""
        with self._lock:
            self._conn.execute(
                """UPDATE batches SET input_file_id = ?, updated_at = ?
                   WHERE run_key = ? AND idx = ? AND part = ?""",
                (input_file_id, now_iso(), run_key, idx, part),
            )

    def update_batch(
        self,
        run_key: str,
        batch_id: str,
        *,
        status: str,
        output_file_id: str | None,
        error_file_id: str | None,
        completed: int,
        failed: int,
        error: str | None = None,
    ) -> None:
        """Record a poll of batch ``batch_id`` of run ``run_key`` (ids are unique per
        provider account, and one ledger may serve several: keyed with the run)."""
        with self._lock:
            self._conn.execute(
                """UPDATE batches SET status = ?, output_file_id = ?, error_file_id = ?,
                   completed = ?, failed = ?, error = COALESCE(?, error), updated_at = ?
                   WHERE run_key = ? AND batch_id = ?""",
                (
                    status,
                    output_file_id,
                    error_file_id,
                    completed,
                    failed,
                    error,
                    now_iso(),
                    run_key,
                    batch_id,
                ),
            )

    def mark_batch_not_found(
        self, run_key: str, batch_id: str, *, file_id: str | None = None
    ) -> None:
        """Record a 404 of the provider: for batch ``batch_id`` itself (its ``status`` reads
        ``not_found`` until a poll finds it again: another API key, or purged), or, with
        ``file_id``, for one of its result files (deleted; said in ``error``)."""
        with self._lock:
            if file_id is None:
                self._conn.execute(
                    """UPDATE batches SET status = 'not_found', updated_at = ?
                       WHERE run_key = ? AND batch_id = ?""",
                    (now_iso(), run_key, batch_id),
                )
            else:
                self._conn.execute(
                    """UPDATE batches SET error = ?, updated_at = ?
                       WHERE run_key = ? AND batch_id = ?""",
                    (
                        f"result file {file_id} not found at the provider (HTTP 404)",
                        now_iso(),
                        run_key,
                        batch_id,
                    ),
                )

    def drop_batch_part(self, run_key: str, idx: int, part: int) -> None:
        """Forget a part still ``creating`` that no batch holds (it is recorded again)."""
        with self._lock:
            self._conn.execute(
                """DELETE FROM batches WHERE run_key = ? AND idx = ? AND part = ?
                   AND state = 'creating'""",
                (run_key, idx, part),
            )

    def run_batches(self, run_key: str, idx: int | None = None) -> list[BatchRecord]:
        """The batches of run ``run_key`` (of chunk ``idx`` only, when given), by chunk and
        part."""
        sql = "SELECT * FROM batches WHERE run_key = ?"
        args: tuple[object, ...] = (run_key,)
        if idx is not None:
            sql, args = sql + " AND idx = ?", (run_key, idx)
        rows = self._conn.execute(sql + " ORDER BY idx, part", args).fetchall()
        return [
            BatchRecord(
                **{f: row[f] for f in BatchRecord.__slots__ if f != "layout"},
                layout=_layout(row["layout"]),
            )
            for row in rows
        ]


def _layout(stored: str | None) -> BatchLayout | None:
    if stored is None:
        return None
    return tuple(
        (str(custom_id), tuple(int(p) for p in rows)) for custom_id, rows in json.loads(stored)
    )
