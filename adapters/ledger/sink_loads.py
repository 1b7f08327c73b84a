"""The ``sink_loads``, ``sink_chunks`` and ``sink_dead_letters`` tables: loads into sinks
(docs/reference/sinks.md, docs/reference/ledger.md).

A cache of what loads did: what a sink holds is decided by the sink's own rows
(``tasks/load/sink_state.py``), never by these tables.
"""

from __future__ import annotations

from collections.abc import Sequence

from adapters.ledger.base import LedgerBase, now_iso
from adapters.ledger.records import SinkLoadRecord
from embedline.models import LoadDeadLetter

__all__ = ["SinkLoadTable"]


class SinkLoadTable(LedgerBase):
    """The ledger's record of runs loaded into sinks, chunk by chunk."""

    def start_load(self, sink: str, run_key: str, *, mode: str) -> SinkLoadRecord:
        """Record that ``run_key`` is being loaded into ``sink`` (a secret-free sink identity);
        a load already recorded keeps its state and loaded chunks (an unfinished one takes
        ``mode``), unless another run's
        load into the same sink finished after it started (then it starts over). Returns the
        record."""
        now = now_iso()
        with self.atomic() as db:
            # Another run's load into this sink finished since ours started: what we loaded
            # may have been overwritten or deleted since, so ours starts over.
            superseded = db.execute(
                """SELECT 1 FROM sink_loads mine JOIN sink_loads other ON other.sink = mine.sink
                   WHERE mine.sink = ? AND mine.run_key = ?
                     AND other.run_key != mine.run_key AND other.state = 'loaded'
                     AND other.updated_at > mine.started_at""",
                (sink, run_key),
            ).fetchone()
            if superseded:
                db.execute(
                    "DELETE FROM sink_chunks WHERE sink = ? AND run_key = ?", (sink, run_key)
                )
                db.execute("DELETE FROM sink_loads WHERE sink = ? AND run_key = ?", (sink, run_key))
            db.execute(
                """INSERT INTO sink_loads (sink, run_key, state, mode, started_at, updated_at)
                   VALUES (?, ?, 'loading', ?, ?, ?)
                   ON CONFLICT (sink, run_key) DO UPDATE SET mode = excluded.mode
                   WHERE sink_loads.state = 'loading'""",
                (sink, run_key, mode, now, now),
            )
        record = self.sink_load(sink, run_key)
        assert record is not None
        return record

    def sink_load(self, sink: str, run_key: str) -> SinkLoadRecord | None:
        """Return the load of ``run_key`` into ``sink``, or None if never started."""
        row = self._conn.execute(
            "SELECT * FROM sink_loads WHERE sink = ? AND run_key = ?", (sink, run_key)
        ).fetchone()
        return SinkLoadRecord(**{f: row[f] for f in SinkLoadRecord.__slots__}) if row else None

    def last_loaded_run(self, sink: str) -> str | None:
        """Return the run key whose load into ``sink`` finished last, or None."""
        row = self._conn.execute(
            """SELECT run_key FROM sink_loads WHERE sink = ? AND state = 'loaded'
               ORDER BY updated_at DESC LIMIT 1""",
            (sink,),
        ).fetchone()
        return None if row is None else str(row[0])

    def loaded_chunks(self, sink: str, run_key: str) -> dict[int, int]:
        """Return ``{chunk index: rows loaded}`` for the chunks of ``run_key`` in ``sink``."""
        rows = self._conn.execute(
            "SELECT idx, rows_loaded FROM sink_chunks WHERE sink = ? AND run_key = ?",
            (sink, run_key),
        )
        return {int(i): int(n) for i, n in rows}

    def mark_chunk_loaded(
        self,
        sink: str,
        run_key: str,
        idx: int,
        *,
        chunk_key: str,
        rows: int,
        dead_letters: Sequence[LoadDeadLetter] = (),
    ) -> None:
        """Record chunk ``idx`` of ``run_key`` as loaded into ``sink`` (``rows`` upserted),
        with the rows the sink refused for good (load dead letters), in one transaction.

        Called only after the sink's own transaction committed: a crash in between reloads
        the chunk, which the sink's upsert by id makes harmless.
        """
        with self.atomic() as db:
            db.executemany(
                """INSERT INTO sink_dead_letters VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (sink, run_key, idx, id) DO NOTHING""",
                [(sink, run_key, idx, d.id, d.reason, d.sqlstate, d.message) for d in dead_letters],
            )
            db.execute(
                """INSERT INTO sink_chunks VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (sink, run_key, idx) DO NOTHING""",
                (sink, run_key, idx, chunk_key, rows, now_iso()),
            )
            db.execute(
                "UPDATE sink_loads SET updated_at = ? WHERE sink = ? AND run_key = ?",
                (now_iso(), sink, run_key),
            )

    def load_dead_letters(self, sink: str, run_key: str) -> list[LoadDeadLetter]:
        """Return the rows of ``run_key`` that ``sink`` refused for good, in chunk order."""
        rows = self._conn.execute(
            """SELECT idx, id, reason, sqlstate, message FROM sink_dead_letters
               WHERE sink = ? AND run_key = ? ORDER BY idx, id""",
            (sink, run_key),
        )
        return [LoadDeadLetter(*r) for r in rows]

    def finish_load(self, sink: str, run_key: str, *, rows_loaded: int, rows_deleted: int) -> None:
        """Record the load of ``run_key`` into ``sink`` as complete (counts in rows)."""
        with self.atomic() as db:
            db.execute(
                """UPDATE sink_loads SET state = 'loaded', rows_loaded = ?, rows_deleted = ?,
                       updated_at = ? WHERE sink = ? AND run_key = ?""",
                (rows_loaded, rows_deleted, now_iso(), sink, run_key),
            )
