"""The ``chunks`` table: each chunk's state, attempts and lease (claim, renew, release, publish)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from adapters.ledger.base import LedgerBase, now_iso
from adapters.ledger.owners import owner_is_dead
from adapters.ledger.records import ChunkRecord
from embedline.models import ChunkOutcome, ChunkSpec, DeadLetter

__all__ = ["ChunkTable"]


class ChunkTable(LedgerBase):
    """The ledger's chunks: one method per transition (``claim``, ``release``,
    ``mark_failed``, ``mark_published``, ``reopen``) and the counts a run reports."""

    def chunk_states(self, run_key: str) -> dict[int, ChunkRecord]:
        """Return the run's chunks by index."""
        rows = self._conn.execute(
            "SELECT * FROM chunks WHERE run_key = ? ORDER BY idx", (run_key,)
        ).fetchall()
        return {r["idx"]: ChunkRecord(**{f: r[f] for f in ChunkRecord.__slots__}) for r in rows}

    def live_state_counts(self, run_key: str) -> dict[str, int]:
        """``state_counts``, but a ``running`` chunk whose lease holder is gone counts as
        ``pending``: the next run reclaims it at once (see ``claim``)."""
        counts: dict[str, int] = {}
        for state, owner in self._conn.execute(
            "SELECT state, lease_owner FROM chunks WHERE run_key = ?", (run_key,)
        ):
            if state == "running" and owner_is_dead(owner):
                state = "pending"
            counts[state] = counts.get(state, 0) + 1
        return counts

    def first_failure(self, run_key: str) -> tuple[int, str] | None:
        """(index, last error) of the run's lowest failed chunk, or None: why the run is not
        complete, in the error's own words (never input text: errors carry none)."""
        row = self._conn.execute(
            "SELECT idx, last_error FROM chunks WHERE run_key = ? AND state = 'failed' "
            "ORDER BY idx LIMIT 1",
            (run_key,),
        ).fetchone()
        return None if row is None else (int(row[0]), str(row[1] or "unknown error"))

    def published_rows(self, run_key: str) -> int:
        """Rows in the run's chunks published so far (what the store holds for it)."""
        row = self._conn.execute(
            """SELECT COALESCE(SUM(o.rows), 0) FROM chunks c JOIN objects o
               ON o.object_uri = c.object_uri WHERE c.run_key = ? AND c.state = 'published'""",
            (run_key,),
        ).fetchone()
        return int(row[0])

    def state_counts(self, run_key: str) -> dict[str, int]:
        """Return ``{state: number of chunks}`` for a run."""
        rows = self._conn.execute(
            "SELECT state, COUNT(*) FROM chunks WHERE run_key = ? GROUP BY state", (run_key,)
        )
        return dict(rows)

    def claim(self, run_key: str, idx: int, *, owner: str, lease_s: float) -> bool:
        """Take chunk ``idx`` for ``owner`` for ``lease_s`` seconds; False if someone holds it.

        A chunk is claimable when ``pending`` or ``failed``, or ``running`` under a lease that
        expired or whose owner is a process on this host that no longer exists (killed:
        no need to wait for the lease to run out). Conditional UPDATEs only: safe against
        concurrent runs.
        """
        now = time.time()
        with self._lock:
            cursor = self._conn.execute(
                """UPDATE chunks SET state = 'running', lease_owner = ?, lease_expires = ?,
                       attempts = attempts + 1, updated_at = ?
                   WHERE run_key = ? AND idx = ? AND (state IN ('pending', 'failed')
                       OR (state = 'running' AND (lease_expires < ? OR lease_owner = ?)))""",
                (owner, now + lease_s, now_iso(), run_key, idx, now, owner),
            )
            if cursor.rowcount == 1:
                return True
            row = self._conn.execute(
                "SELECT lease_owner FROM chunks"
                " WHERE run_key = ? AND idx = ? AND state = 'running'",
                (run_key, idx),
            ).fetchone()
            if row is None or not owner_is_dead(row[0]):
                return False
            cursor = self._conn.execute(
                """UPDATE chunks SET lease_owner = ?, lease_expires = ?, attempts = attempts + 1,
                       updated_at = ?
                   WHERE run_key = ? AND idx = ? AND state = 'running' AND lease_owner = ?""",
                (owner, now + lease_s, now_iso(), run_key, idx, row[0]),
            )
            return cursor.rowcount == 1

    def renew(self, run_key: str, idxs: Sequence[int], *, owner: str, lease_s: float) -> None:
        """Extend ``owner``'s leases on chunks ``idxs`` to now + ``lease_s`` seconds."""
        expires = time.time() + lease_s
        with self.atomic() as db:
            db.executemany(
                """UPDATE chunks SET lease_expires = ? WHERE run_key = ? AND idx = ?
                   AND state = 'running' AND lease_owner = ?""",
                [(expires, run_key, i, owner) for i in idxs],
            )

    def release(self, run_key: str, idx: int, *, owner: str, error: str | None = None) -> None:
        """Give chunk ``idx`` back (state ``pending``) if ``owner`` holds it."""
        with self._lock:
            self._conn.execute(
                """UPDATE chunks SET state = 'pending', lease_owner = NULL, lease_expires = NULL,
                       last_error = COALESCE(?, last_error), updated_at = ?
                   WHERE run_key = ? AND idx = ? AND state = 'running' AND lease_owner = ?""",
                (error, now_iso(), run_key, idx, owner),
            )

    def mark_failed(self, run_key: str, idx: int, *, owner: str | None, error: str) -> None:
        """Record that chunk ``idx`` failed with ``error`` (an error class and message, no text)."""
        with self._lock:
            self._conn.execute(
                """UPDATE chunks SET state = 'failed', lease_owner = NULL, lease_expires = NULL,
                       last_error = ?, updated_at = ?
                   WHERE run_key = ? AND idx = ? AND state != 'published'
                       AND (? IS NULL OR lease_owner IS NULL OR lease_owner = ?)""",
                (error[:2000], now_iso(), run_key, idx, owner, owner),
            )

    def record_published(
        self, run_key: str, spec: ChunkSpec, outcome: ChunkOutcome, *, object_uri: str
    ) -> None:
        """``mark_published`` from what publishing chunk ``spec`` gave (``outcome``: its task's
        return, or the adoption of its object found in the store): the object's SHA-256,
        rows and dead letters; ``object_uri`` is the store's URI of ``outcome.object_key``."""
        self.mark_published(
            run_key,
            spec,
            object_uri=object_uri,
            sha256=outcome.object_sha256,
            rows=outcome.rows,
            dead_letters=outcome.dead_letters,
        )

    def mark_published(
        self,
        run_key: str,
        spec: ChunkSpec,
        *,
        object_uri: str,
        sha256: str,
        rows: int,
        dead_letters: Sequence[DeadLetter],
    ) -> None:
        """Record chunk ``spec`` as published: its object, and its dead letters, atomically.

        The dead letters replace those recorded for the chunk's content: a later generation
        (docs/reference/output-layout.md, "Generations") supersedes the earlier one's."""
        now = now_iso()
        with self.atomic() as db:
            db.execute(
                """INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (object_uri) DO NOTHING""",
                (object_uri, spec.key, sha256, rows, len(dead_letters), now),
            )
            db.execute("DELETE FROM dead_letters WHERE chunk_key = ?", (spec.key,))
            db.executemany(
                "INSERT OR REPLACE INTO dead_letters VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (
                        spec.key,
                        d.row_number - spec.first_row,
                        d.id,
                        d.reason,
                        d.http_status,
                        d.attempts,
                    )
                    for d in dead_letters
                ],
            )
            db.execute(
                """UPDATE chunks SET state = 'published', lease_owner = NULL,
                       lease_expires = NULL, last_error = NULL, updated_at = ?
                   WHERE run_key = ? AND idx = ?""",
                (now, run_key, spec.index),
            )

    def reopen(self, run_key: str, idx: int) -> None:
        """Make published chunk ``idx`` claimable again (``pending``), to supersede its dead
        letters with a new generation; its published object stays as it is."""
        with self.atomic() as db:
            db.execute(
                """UPDATE chunks SET state = 'pending', updated_at = ?
                   WHERE run_key = ? AND idx = ? AND state = 'published'""",
                (now_iso(), run_key, idx),
            )
