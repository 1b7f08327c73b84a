"""The ``objects`` and ``dead_letters`` tables: published chunk objects and their rejected rows."""

from __future__ import annotations

from adapters.ledger.base import LedgerBase
from adapters.ledger.records import ObjectRecord
from embedline.models import ChunkSpec, DeadLetter

__all__ = ["ObjectTable"]


class ObjectTable(LedgerBase):
    """Published objects (content-addressed, shared by every run) and their dead letters."""

    def published_object(self, object_uri: str) -> ObjectRecord | None:
        """Return the published object at ``object_uri``, from any run, or None."""
        row = self._conn.execute(
            "SELECT * FROM objects WHERE object_uri = ?", (object_uri,)
        ).fetchone()
        return ObjectRecord(**{f: row[f] for f in ObjectRecord.__slots__}) if row else None

    def chunk_dead_letters(self, spec: ChunkSpec) -> list[DeadLetter]:
        """Return the dead letters recorded for ``spec``'s content, numbered for this run."""
        rows = self._conn.execute(
            "SELECT * FROM dead_letters WHERE chunk_key = ? ORDER BY chunk_row", (spec.key,)
        )
        return [
            DeadLetter(
                spec.first_row + r["chunk_row"],
                r["id"],
                r["reason"],
                r["http_status"],
                r["attempts"],
            )
            for r in rows
        ]

    def run_dead_letters(self, run_key: str) -> list[DeadLetter]:
        """Return the run's dead letters in row order (row numbers are 1-based records): its
        published chunks' and those it wrote to no chunk (``record_unwritten``)."""
        rows = self._conn.execute(
            """SELECT c.first_row + d.chunk_row AS row_number, d.id, d.reason, d.http_status,
                      d.attempts
               FROM chunks c JOIN dead_letters d ON d.chunk_key = c.chunk_key
               WHERE c.run_key = ? AND c.state = 'published'
               UNION ALL
               SELECT d.chunk_row, d.id, d.reason, d.http_status, d.attempts
               FROM dead_letters d WHERE d.chunk_key = ?
               ORDER BY row_number""",
            (run_key, _UNWRITTEN + run_key),
        )
        return [DeadLetter(*r) for r in rows]

    def record_unwritten(self, run_key: str, dead: list[DeadLetter]) -> None:
        """Record dead letters of ``run_key`` that no chunk holds (a delta night's empty
        texts: docs/nights.md), by row number, in ``dead_letters`` under the pseudo chunk key
        ``unwritten:{run_key}``; recording them again replaces them."""
        with self.atomic():
            self._conn.executemany(
                "INSERT OR REPLACE INTO dead_letters VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (_UNWRITTEN + run_key, d.row_number, d.id, d.reason, d.http_status, d.attempts)
                    for d in dead
                ],
            )


#: The pseudo chunk key prefix of a run's dead letters that no chunk holds.
_UNWRITTEN = "unwritten:"
