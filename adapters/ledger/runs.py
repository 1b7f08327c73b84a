"""The ``runs`` table: one row per run key, its status, counts and owning process."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from adapters.ledger.base import LedgerBase, now_iso
from adapters.ledger.owners import new_owner, owner_is_dead
from adapters.ledger.records import RunRecord
from embedline.models import InputPlan

__all__ = ["RunTable"]


class RunTable(LedgerBase):
    """The ledger's runs: start (with its chunks), finish, stop, commit and look-ups."""

    def start_run(
        self,
        run_key: str,
        plan: InputPlan,
        *,
        output_uri: str,
        settings: dict[str, object],
        flow_run_id: str | None,
        object_uris: Sequence[str],
    ) -> None:
        """Record a run and its chunks; chunks already present keep their state and attempts.

        ``object_uris[i]`` is the full URI of chunk ``i``'s object under ``output_uri``. The
        ledger holds one record per run key: a run to another output root takes it over,
        re-points the chunks, sets those not published there back to ``pending``, and
        starts the run's counts and manifest afresh (the other output's stay in its store).
        """
        now = now_iso()
        with self.atomic() as db:
            db.execute(
                """INSERT INTO runs (run_key, input_name, input_sha256, input_bytes, input_rows,
                       output_uri, settings_json, status, chunks_total, flow_run_id,
                       created_at, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)
                   ON CONFLICT (run_key) DO UPDATE SET
                       rows_published = CASE WHEN runs.output_uri = excluded.output_uri
                                             THEN runs.rows_published ELSE 0 END,
                       rows_failed = CASE WHEN runs.output_uri = excluded.output_uri
                                          THEN runs.rows_failed ELSE 0 END,
                       manifest_uri = CASE WHEN runs.output_uri = excluded.output_uri
                                           THEN runs.manifest_uri END,
                       output_uri = excluded.output_uri, settings_json = excluded.settings_json,
                       status = 'running', flow_run_id = excluded.flow_run_id,
                       updated_at = excluded.updated_at""",
                (
                    run_key,
                    plan.source.name,
                    plan.sha256,
                    plan.bytes,
                    plan.rows,
                    output_uri,
                    json.dumps(settings, sort_keys=True),
                    len(plan.chunks),
                    flow_run_id,
                    now,
                    now,
                ),
            )
            db.executemany(
                """INSERT INTO chunks (run_key, idx, chunk_key, first_row, rows_total, state,
                       object_uri, updated_at)
                   VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)
                   ON CONFLICT (run_key, idx) DO UPDATE SET
                       state = CASE WHEN chunks.object_uri = excluded.object_uri
                                    THEN chunks.state ELSE 'pending' END,
                       object_uri = excluded.object_uri, chunk_key = excluded.chunk_key,
                       first_row = excluded.first_row, rows_total = excluded.rows_total""",
                [
                    (run_key, s.index, s.key, s.first_row, s.rows, uri, now)
                    for s, uri in zip(plan.chunks, object_uris, strict=True)
                ],
            )
            # a plan of other chunks (a delta night planned against another base): its
            # count, and no chunk past it
            db.execute(
                "UPDATE runs SET owner = ?, chunks_total = ? WHERE run_key = ?",
                (new_owner(), len(plan.chunks), run_key),
            )
            db.execute(
                "DELETE FROM chunks WHERE run_key = ? AND idx >= ?", (run_key, len(plan.chunks))
            )

    def finish_run(
        self,
        run_key: str,
        *,
        status: str,
        rows_published: int,
        rows_failed: int,
        manifest_uri: str | None,
        facts: dict[str, object] | None = None,
    ) -> None:
        """Record a run's final status (``completed``, ``incomplete``, ``failed``,
        ``interrupted``) and counts (rows); ``facts``, a committed run's JSON-ready
        ``flows.events.run_payload`` (counts only), replaces the stored ones when given."""
        with self.atomic() as db:
            db.execute(
                """UPDATE runs SET status = ?, rows_published = ?, rows_failed = ?,
                       manifest_uri = COALESCE(?, manifest_uri), updated_at = ?,
                       facts_json = COALESCE(?, facts_json)
                   WHERE run_key = ?""",
                (
                    status,
                    rows_published,
                    rows_failed,
                    manifest_uri,
                    now_iso(),
                    None if facts is None else json.dumps(facts, sort_keys=True),
                    run_key,
                ),
            )

    def run_facts(self, run_key: str) -> dict[str, object] | None:
        """The facts recorded when ``run_key`` committed (``finish_run(facts=…)``), or None
        (not committed by this ledger's runs, or committed before the ledger kept them)."""
        row = self._conn.execute(
            "SELECT facts_json FROM runs WHERE run_key = ?", (run_key,)
        ).fetchone()
        return None if row is None or row[0] is None else dict(json.loads(row[0]))

    def runs(self) -> list[RunRecord]:
        """Return every run, newest first."""
        return [
            self._run_record(r)
            for r in self._conn.execute("SELECT * FROM runs ORDER BY updated_at DESC")
        ]

    def find_run(self, key_or_prefix: str) -> RunRecord | None:
        """Return the run whose key is ``key_or_prefix`` or starts with it (≥ 8 hex chars).

        :raises ValueError: if the prefix is shorter than 8 characters, not hex, or ambiguous.
        """
        prefix = key_or_prefix.strip().lower()
        if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
            raise ValueError("a run key prefix needs at least 8 hex characters")
        rows = self._conn.execute(
            "SELECT * FROM runs WHERE run_key >= ? AND run_key < ? LIMIT 2",
            (prefix, prefix + "g"),
        ).fetchall()
        if len(rows) > 1:
            raise ValueError(f"run key prefix {prefix!r} is ambiguous; give more characters")
        return self._run_record(rows[0]) if rows else None

    def run_settings(self, run_key: str) -> dict[str, object]:
        """Return the settings a run was started with (no secrets are ever stored).

        :raises KeyError: no such run.
        """
        row = self._conn.execute(
            "SELECT settings_json FROM runs WHERE run_key = ?", (run_key,)
        ).fetchone()
        if row is None:
            raise KeyError(run_key)
        return dict(json.loads(row[0]))

    @staticmethod
    def _run_record(row: sqlite3.Row) -> RunRecord:
        return RunRecord(**{f: row[f] for f in RunRecord.__slots__})

    def run_process_gone(self, run_key: str) -> bool:
        """True if the process recorded as running ``run_key`` is known to be gone (this
        host only; a run of another host, or of an older ledger, counts as alive)."""
        row = self._conn.execute("SELECT owner FROM runs WHERE run_key = ?", (run_key,)).fetchone()
        return row is not None and owner_is_dead(row[0])

    def mark_stopped(self, run_key: str, *, status: str = "interrupted") -> None:
        """Set a ``running`` run to ``status`` (``interrupted``: a signal or a hard stop of
        its own process; ``crashed``: an unexpected error). A run that already ended keeps
        its status: an interrupt that lands just after the commit must not make a
        ``complete`` run read ``interrupted``."""
        with self.atomic() as db:
            db.execute(
                "UPDATE runs SET status = ?, updated_at = ? "
                "WHERE run_key = ? AND status = 'running'",
                (status, now_iso(), run_key),
            )

    def record_committed(
        self, run_key: str, *, manifest_uri: str, rows_published: int, rows_failed: int
    ) -> bool:
        """Make a run whose manifest is in the store read ``complete``, with the manifest's
        counts (rows), if the ledger says otherwise: the process died or was stopped between
        the manifest's PUT (the commit point, docs/reference/output-layout.md) and the ledger's
        write. Returns True if the ledger changed; a run the ledger never saw is left alone."""
        with self.atomic() as db:
            changed = db.execute(
                """UPDATE runs SET status = 'complete', rows_published = ?, rows_failed = ?,
                       manifest_uri = ?, updated_at = ?
                   WHERE run_key = ? AND (status != 'complete' OR manifest_uri IS NOT ?
                                          OR rows_published != ? OR rows_failed != ?)""",
                (
                    rows_published,
                    rows_failed,
                    manifest_uri,
                    now_iso(),
                    run_key,
                    manifest_uri,
                    rows_published,
                    rows_failed,
                ),
            ).rowcount
        return changed > 0
