"""The SQLite ledger: what each run did, which objects are published, which rows are dead letters.

One file in WAL mode with ``synchronous=NORMAL``; every write is a single conditional
statement or a short ``BEGIN IMMEDIATE`` transaction (a deferred transaction that reads then
writes fails at once with "database is locked" under contention, whatever the busy timeout:
see ../shared/STACK-NOTES.md). It stores ids, keys, counts and error classes: never input text,
never secrets.

Tables:

- ``meta``: ``schema_version`` and applied migrations.
- ``runs``: one row per run key: input identity, output URI, settings (JSON, no secrets),
  status, counts, manifest URI, Prefect flow-run id, times.
- ``chunks``: one row per (run key, chunk index): chunk key, state
  (``pending|running|published|failed``), attempts, last error, lease owner and expiry.
- ``objects``: one row per published object URI, content-addressed: chunk key, SHA-256, rows,
  dead-letter count. A chunk whose object URI is here is published for every run.
- ``dead_letters``: per chunk key and 0-based row within the chunk: id, reason, HTTP status,
  attempts. Dead letters are final for that content (DESIGN §4).
- ``sink_loads`` (migration ``0004_sinks``): one row per (sink, run key) load: ``loading`` or
  ``loaded``, mode (``replace`` or ``changes``), rows upserted and deleted.
- ``sink_chunks``: one row per chunk of a run loaded into a sink (written after the sink's
  transaction committed). Both are a cache of what loads did: what a sink holds is decided
  by the sink's own rows (DESIGN §9, ``tasks/sink_state.py``), never by these tables.
- ``reuse_objects`` / ``reuse_texts`` (the reuse index, DESIGN §8): which chunk objects under
  which output root hold a vector for which text, by (output URI, model, requested
  dimensions as in the row key: "" or decimal). ``text_sha256`` is stored as 32 raw bytes,
  about 90 bytes per row on disk with its B-tree (1M rows: 89 MB), nothing in RAM. A cache
  of the store: rebuilt from the chunk objects' ``text_sha256`` columns when it misses any.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from adapters.disk_full import LedgerConnection, translate_full
from adapters.processes import local_process_is_gone
from embedline.errors import DiskFullError
from embedline.models import ChunkSpec, DeadLetter, InputPlan, LoadDeadLetter

__all__ = ["SCHEMA_VERSION", "ChunkRecord", "Ledger", "ObjectRecord", "RunRecord", "SinkLoadRecord",
           "new_owner", "record_hard_stop"]  # fmt: skip

_MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "0001_initial",
        """
        CREATE TABLE runs (
            run_key TEXT PRIMARY KEY,
            input_name TEXT NOT NULL,
            input_sha256 TEXT NOT NULL,
            input_bytes INTEGER NOT NULL,
            input_rows INTEGER NOT NULL,
            output_uri TEXT NOT NULL,
            settings_json TEXT NOT NULL,
            status TEXT NOT NULL,
            chunks_total INTEGER NOT NULL,
            rows_published INTEGER NOT NULL DEFAULT 0,
            rows_failed INTEGER NOT NULL DEFAULT 0,
            manifest_uri TEXT,
            flow_run_id TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        ) STRICT;
        CREATE TABLE chunks (
            run_key TEXT NOT NULL REFERENCES runs(run_key),
            idx INTEGER NOT NULL,
            chunk_key TEXT NOT NULL,
            first_row INTEGER NOT NULL,
            rows_total INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'published', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            object_uri TEXT NOT NULL,
            last_error TEXT,
            lease_owner TEXT,
            lease_expires REAL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (run_key, idx)
        ) STRICT;
        CREATE INDEX chunks_by_state ON chunks (run_key, state);
        CREATE TABLE objects (
            object_uri TEXT PRIMARY KEY,
            chunk_key TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            rows INTEGER NOT NULL,
            dead_letters INTEGER NOT NULL,
            created_at TEXT NOT NULL
        ) STRICT;
        CREATE TABLE dead_letters (
            chunk_key TEXT NOT NULL,
            chunk_row INTEGER NOT NULL,
            id TEXT NOT NULL,
            reason TEXT NOT NULL,
            http_status INTEGER,
            attempts INTEGER NOT NULL,
            PRIMARY KEY (chunk_key, chunk_row)
        ) STRICT;
        """,
    ),
    (
        "0002_reuse",
        """
        CREATE TABLE reuse_objects (
            object_id INTEGER PRIMARY KEY,
            output_uri TEXT NOT NULL,
            object_key TEXT NOT NULL,
            model TEXT NOT NULL,
            dimensions TEXT NOT NULL,
            rows INTEGER NOT NULL,
            indexed_at TEXT NOT NULL,
            UNIQUE (output_uri, object_key)
        ) STRICT;
        CREATE TABLE reuse_texts (
            text_sha256 BLOB NOT NULL,
            object_id INTEGER NOT NULL,
            PRIMARY KEY (text_sha256, object_id)
        ) STRICT, WITHOUT ROWID;
        CREATE INDEX reuse_texts_by_object ON reuse_texts (object_id);
        """,
    ),
)

_MIGRATIONS += (
    (
        "0004_sinks",
        """
        CREATE TABLE sink_loads (
            sink TEXT NOT NULL,
            run_key TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('loading', 'loaded')),
            mode TEXT NOT NULL CHECK (mode IN ('replace', 'changes')),
            rows_loaded INTEGER NOT NULL DEFAULT 0,
            rows_deleted INTEGER NOT NULL DEFAULT 0,
            started_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (sink, run_key)
        ) STRICT;
        CREATE TABLE sink_chunks (
            sink TEXT NOT NULL,
            run_key TEXT NOT NULL,
            idx INTEGER NOT NULL,
            chunk_key TEXT NOT NULL,
            rows_loaded INTEGER NOT NULL,
            loaded_at TEXT NOT NULL,
            PRIMARY KEY (sink, run_key, idx)
        ) STRICT;
        """,
    ),
    (
        # The process that runs a run (``host:pid:random``), so ``status`` can tell a run
        # that is going from one whose process is gone (killed, second Ctrl-C).
        "0005_run_owner",
        "ALTER TABLE runs ADD COLUMN owner TEXT;",
    ),
)

_MIGRATIONS += (
    (
        # Rows a sink refuses for good (DESIGN §9): load dead letters, listed by
        # ``embedline dead-letters RUN --sink URI``; written with the chunk's load record.
        "0006_sink_dead_letters",
        """
        CREATE TABLE sink_dead_letters (
            sink TEXT NOT NULL,
            run_key TEXT NOT NULL,
            idx INTEGER NOT NULL,
            id TEXT NOT NULL,
            reason TEXT NOT NULL,
            sqlstate TEXT,
            message TEXT NOT NULL,
            PRIMARY KEY (sink, run_key, idx, id)
        ) STRICT;
        """,
    ),
)

#: One more per migration; migrations are applied by name, each once, in tuple order.
SCHEMA_VERSION = len(_MIGRATIONS)

#: Text hashes per lookup query (SQLite allows 32,766 parameters since 3.32).
_LOOKUP_BATCH = 500


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_owner() -> str:
    """Return a lease owner id unique to this process and run: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


#: This process as a run owner (``host:pid:random``), recorded by ``start_run``.
_PROCESS_OWNER = new_owner()


def _owner_is_dead(owner: str | None) -> bool:
    """True if ``owner`` (``host:pid:random``) names a process of this host that is gone."""
    parts = (owner or "").rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname():
        return False
    # our own lease from an earlier run in this process is not "gone": it expires instead
    return parts[1].isdigit() and local_process_is_gone(int(parts[1]))


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A ``runs`` row (counts in rows/chunks; times UTC ISO-8601)."""

    run_key: str
    input_name: str
    input_rows: int
    output_uri: str
    status: str
    chunks_total: int
    rows_published: int
    rows_failed: int
    manifest_uri: str | None
    updated_at: str


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """A ``chunks`` row; ``lease_expires`` is a Unix time in seconds."""

    idx: int
    chunk_key: str
    state: str
    attempts: int
    last_error: str | None
    lease_owner: str | None
    lease_expires: float | None


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """An ``objects`` row: a published chunk object (``rows`` in the object)."""

    object_uri: str
    chunk_key: str
    sha256: str
    rows: int
    dead_letters: int


@dataclass(frozen=True, slots=True)
class SinkLoadRecord:
    """A ``sink_loads`` row: the load of one run into one sink (rows; UTC ISO-8601 time)."""

    sink: str
    run_key: str
    state: str
    mode: str
    rows_loaded: int
    rows_deleted: int
    updated_at: str


class Ledger:
    """The run ledger in one SQLite file (``":memory:"`` for tests).

    Thread-safe: one connection guarded by a lock, so the flow process's threads (dispatch,
    signal handling) may share it. ``busy_timeout_s`` (seconds) bounds the wait for another
    process's write lock.

    :raises sqlite3.DatabaseError: if the file is not a SQLite database.
    :raises DiskFullError: (exit 1) the ledger's filesystem is full, at open, migration, any
        write or the WAL checkpoint (``adapters.disk_full.LedgerConnection``).
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0) -> None:
        self.path = os.fspath(path)
        with translate_full(self.path, "ledger"):  # creating the file, WAL and migrations
            if self.path != ":memory:":
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False, factory=LedgerConnection)
            self._conn.ledger_path = self.path  # every statement: a full disk, one line
            self._conn.row_factory = sqlite3.Row
            self._lock = threading.RLock()
            self._depth = 0
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate()

    def close(self) -> None:
        """Close the connection. A full filesystem is ignored here: the WAL that could not be
        checkpointed is replayed by the next open, so nothing is lost."""
        with self._lock, contextlib.suppress(DiskFullError):
            self._conn.close()

    # -- transactions ---------------------------------------------------------------------

    @contextlib.contextmanager
    def atomic(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction (a SAVEPOINT when nested); rolls back on error."""
        with self._lock:
            name = f"sp{self._depth}"
            begin, commit, rollback = (
                ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")
                if self._depth == 0
                else (f"SAVEPOINT {name}", f"RELEASE {name}", f"ROLLBACK TO {name}")
            )
            self._conn.execute(begin)
            self._depth += 1
            try:
                yield self._conn
            except BaseException:
                if self._conn.in_transaction:  # SQLITE_FULL may have rolled it back already
                    self._conn.execute(rollback)
                    if self._depth > 1:
                        self._conn.execute(f"RELEASE {name}")
                raise
            else:
                self._conn.execute(commit)
            finally:
                self._depth -= 1

    def _migrate(self) -> None:
        with self.atomic() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT) STRICT")
            done = {r[0] for r in db.execute("SELECT key FROM meta WHERE key LIKE 'migration:%'")}
            for name, sql in _MIGRATIONS:
                if f"migration:{name}" in done:
                    continue
                for statement in filter(str.strip, sql.split(";")):
                    db.execute(statement)
                db.execute("INSERT INTO meta VALUES (?, ?)", (f"migration:{name}", _now_iso()))
            db.execute(
                "INSERT INTO meta VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )

    def schema_version(self) -> int:
        """Return the schema version stored in ``meta``."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    # -- runs ------------------------------------------------------------------------------

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
        now = _now_iso()
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
                    run_key, plan.source.name, plan.sha256, plan.bytes, plan.rows, output_uri,
                    json.dumps(settings, sort_keys=True), len(plan.chunks), flow_run_id, now, now,
                ),
            )  # fmt: skip
            db.executemany(
                """INSERT INTO chunks (run_key, idx, chunk_key, first_row, rows_total, state,
                       object_uri, updated_at)
                   VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)
                   ON CONFLICT (run_key, idx) DO UPDATE SET
                       state = CASE WHEN chunks.object_uri = excluded.object_uri
                                    THEN chunks.state ELSE 'pending' END,
                       object_uri = excluded.object_uri""",
                [
                    (run_key, s.index, s.key, s.first_row, s.rows, uri, now)
                    for s, uri in zip(plan.chunks, object_uris, strict=True)
                ],
            )
            db.execute("UPDATE runs SET owner = ? WHERE run_key = ?", (_PROCESS_OWNER, run_key))

    def finish_run(
        self,
        run_key: str,
        *,
        status: str,
        rows_published: int,
        rows_failed: int,
        manifest_uri: str | None,
    ) -> None:
        """Record a run's final status (``completed``, ``incomplete``, ``failed``,
        ``interrupted``) and counts (rows)."""
        with self.atomic() as db:
            db.execute(
                """UPDATE runs SET status = ?, rows_published = ?, rows_failed = ?,
                       manifest_uri = COALESCE(?, manifest_uri), updated_at = ?
                   WHERE run_key = ?""",
                (status, rows_published, rows_failed, manifest_uri, _now_iso(), run_key),
            )

    def runs(self) -> list[RunRecord]:
        """Return every run, newest first."""
        return [self._run_record(r) for r in self._conn.execute(
            "SELECT * FROM runs ORDER BY updated_at DESC"
        )]  # fmt: skip

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

    # -- chunks ----------------------------------------------------------------------------

    def chunk_states(self, run_key: str) -> dict[int, ChunkRecord]:
        """Return the run's chunks by index."""
        rows = self._conn.execute(
            "SELECT * FROM chunks WHERE run_key = ? ORDER BY idx", (run_key,)
        ).fetchall()
        return {r["idx"]: ChunkRecord(**{f: r[f] for f in ChunkRecord.__slots__}) for r in rows}

    def run_process_gone(self, run_key: str) -> bool:
        """True if the process recorded as running ``run_key`` is known to be gone (this
        host only; a run of another host, or of an older ledger, counts as alive)."""
        row = self._conn.execute("SELECT owner FROM runs WHERE run_key = ?",
                                 (run_key,)).fetchone()  # fmt: skip
        return row is not None and _owner_is_dead(row[0])

    def live_state_counts(self, run_key: str) -> dict[str, int]:
        """``state_counts``, but a ``running`` chunk whose lease holder is gone counts as
        ``pending``: the next run reclaims it at once (see ``claim``)."""
        counts: dict[str, int] = {}
        for state, owner in self._conn.execute(
                "SELECT state, lease_owner FROM chunks WHERE run_key = ?", (run_key,)):  # fmt: skip
            if state == "running" and _owner_is_dead(owner):
                state = "pending"
            counts[state] = counts.get(state, 0) + 1
        return counts

    def first_failure(self, run_key: str) -> tuple[int, str] | None:
        """(index, last error) of the run's lowest failed chunk, or None: why the run is not
        complete, in the error's own words (never input text: errors carry none)."""
        row = self._conn.execute(
            "SELECT idx, last_error FROM chunks WHERE run_key = ? AND state = 'failed' "
            "ORDER BY idx LIMIT 1", (run_key,)).fetchone()  # fmt: skip
        return None if row is None else (int(row[0]), str(row[1] or "unknown error"))

    def published_rows(self, run_key: str) -> int:
        """Rows in the run's chunks published so far (what the store holds for it)."""
        row = self._conn.execute(
            """SELECT COALESCE(SUM(o.rows), 0) FROM chunks c JOIN objects o
               ON o.object_uri = c.object_uri WHERE c.run_key = ? AND c.state = 'published'""",
            (run_key,),
        ).fetchone()
        return int(row[0])

    def mark_stopped(self, run_key: str, *, status: str = "interrupted") -> None:
        """Set a ``running`` run to ``status`` (``interrupted``: a signal or a hard stop of
        its own process; ``crashed``: an unexpected error). A run that already ended keeps
        its status: an interrupt that lands just after the commit must not make a
        ``complete`` run read ``interrupted``."""
        with self.atomic() as db:
            db.execute("UPDATE runs SET status = ?, updated_at = ? "
                       "WHERE run_key = ? AND status = 'running'",
                       (status, _now_iso(), run_key))  # fmt: skip

    def record_committed(
        self, run_key: str, *, manifest_uri: str, rows_published: int, rows_failed: int
    ) -> bool:
        """Make a run whose manifest is in the store read ``complete``, with the manifest's
        counts (rows), if the ledger says otherwise: the process died or was stopped between
        the manifest's PUT (the commit point, DESIGN §4) and the ledger's write. Returns
        True if the ledger changed; a run the ledger never saw is left alone."""
        with self.atomic() as db:
            changed = db.execute(
                """UPDATE runs SET status = 'complete', rows_published = ?, rows_failed = ?,
                       manifest_uri = ?, updated_at = ?
                   WHERE run_key = ? AND (status != 'complete' OR manifest_uri IS NOT ?
                                          OR rows_published != ? OR rows_failed != ?)""",
                (rows_published, rows_failed, manifest_uri, _now_iso(), run_key, manifest_uri,
                 rows_published, rows_failed),
            ).rowcount  # fmt: skip
        return changed > 0

    def state_counts(self, run_key: str) -> dict[str, int]:
        """Return ``{state: number of chunks}`` for a run."""
        rows = self._conn.execute(
            "SELECT state, COUNT(*) FROM chunks WHERE run_key = ? GROUP BY state", (run_key,)
        )
        return {state: n for state, n in rows}

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
                (owner, now + lease_s, _now_iso(), run_key, idx, now, owner),
            )
            if cursor.rowcount == 1:
                return True
            row = self._conn.execute(
                "SELECT lease_owner FROM chunks WHERE run_key = ? AND idx = ? AND state = 'running'",
                (run_key, idx),
            ).fetchone()
            if row is None or not _owner_is_dead(row[0]):
                return False
            cursor = self._conn.execute(
                """UPDATE chunks SET lease_owner = ?, lease_expires = ?, attempts = attempts + 1,
                       updated_at = ?
                   WHERE run_key = ? AND idx = ? AND state = 'running' AND lease_owner = ?""",
                (owner, now + lease_s, _now_iso(), run_key, idx, row[0]),
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
                (error, _now_iso(), run_key, idx, owner),
            )

    def mark_failed(self, run_key: str, idx: int, *, owner: str | None, error: str) -> None:
        """Record that chunk ``idx`` failed with ``error`` (an error class and message, no text)."""
        with self._lock:
            self._conn.execute(
                """UPDATE chunks SET state = 'failed', lease_owner = NULL, lease_expires = NULL,
                       last_error = ?, updated_at = ?
                   WHERE run_key = ? AND idx = ? AND state != 'published'
                       AND (? IS NULL OR lease_owner IS NULL OR lease_owner = ?)""",
                (error[:2000], _now_iso(), run_key, idx, owner, owner),
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
        (DESIGN §8) supersedes the earlier one's."""
        now = _now_iso()
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
                    (spec.key, d.row_number - spec.first_row, d.id, d.reason, d.http_status,
                     d.attempts)
                    for d in dead_letters
                ],
            )  # fmt: skip
            db.execute(
                """UPDATE chunks SET state = 'published', lease_owner = NULL,
                       lease_expires = NULL, last_error = NULL, updated_at = ?
                   WHERE run_key = ? AND idx = ?""",
                (now, run_key, spec.index),
            )

    # -- objects and dead letters ----------------------------------------------------------

    def reopen(self, run_key: str, idx: int) -> None:
        """Make published chunk ``idx`` claimable again (``pending``), to supersede its dead
        letters with a new generation; its published object stays as it is."""
        with self.atomic() as db:
            db.execute(
                """UPDATE chunks SET state = 'pending', updated_at = ?
                   WHERE run_key = ? AND idx = ? AND state = 'published'""",
                (_now_iso(), run_key, idx),
            )

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
            DeadLetter(spec.first_row + r["chunk_row"], r["id"], r["reason"], r["http_status"],
                       r["attempts"])
            for r in rows
        ]  # fmt: skip

    def run_dead_letters(self, run_key: str) -> list[DeadLetter]:
        """Return the run's dead letters in row order (row numbers are 1-based records)."""
        rows = self._conn.execute(
            """SELECT c.first_row + d.chunk_row AS row_number, d.id, d.reason, d.http_status,
                      d.attempts
               FROM chunks c JOIN dead_letters d ON d.chunk_key = c.chunk_key
               WHERE c.run_key = ? AND c.state = 'published'
               ORDER BY row_number""",
            (run_key,),
        )
        return [DeadLetter(*r) for r in rows]

    # -- sink loads (DESIGN §8) ------------------------------------------------------------

    def start_load(self, sink: str, run_key: str, *, mode: str) -> SinkLoadRecord:
        """Record that ``run_key`` is being loaded into ``sink`` (a secret-free sink identity);
        a load already recorded keeps its state and loaded chunks (an unfinished one takes
        ``mode``), unless another run's
        load into the same sink finished after it started (then it starts over). Returns the
        record."""
        now = _now_iso()
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
                db.execute("DELETE FROM sink_chunks WHERE sink = ? AND run_key = ?",
                           (sink, run_key))
                db.execute("DELETE FROM sink_loads WHERE sink = ? AND run_key = ?",
                           (sink, run_key))
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
        self, sink: str, run_key: str, idx: int, *, chunk_key: str, rows: int,
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
                [(sink, run_key, idx, d.id, d.reason, d.sqlstate, d.message)
                 for d in dead_letters],
            )
            db.execute(
                """INSERT INTO sink_chunks VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (sink, run_key, idx) DO NOTHING""",
                (sink, run_key, idx, chunk_key, rows, _now_iso()),
            )
            db.execute(
                "UPDATE sink_loads SET updated_at = ? WHERE sink = ? AND run_key = ?",
                (_now_iso(), sink, run_key),
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
                (rows_loaded, rows_deleted, _now_iso(), sink, run_key),
            )

    # -- reuse index -----------------------------------------------------------------------

    def indexed_objects(self, output_uri: str) -> set[str]:
        """Return the object keys under ``output_uri`` that the reuse index covers."""
        rows = self._conn.execute(
            "SELECT object_key FROM reuse_objects WHERE output_uri = ?", (output_uri,)
        )
        return {r[0] for r in rows}

    def index_object(
        self,
        output_uri: str,
        object_key: str,
        *,
        model: str,
        dimensions: str,
        text_hashes: Sequence[str],
    ) -> None:
        """Add a chunk object's texts (hex SHA-256s) to the reuse index, atomically.

        ``dimensions`` is the requested dimensions as in the row key ("" when unset).
        Indexing an object twice (a concurrent run) changes nothing.
        """
        with self.atomic() as db:
            cursor = db.execute(
                """INSERT INTO reuse_objects (output_uri, object_key, model, dimensions, rows,
                       indexed_at) VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (output_uri, object_key) DO NOTHING RETURNING object_id""",
                (output_uri, object_key, model, dimensions, len(text_hashes), _now_iso()),
            )
            row = cursor.fetchone()
            if row is None:
                return
            db.executemany("INSERT OR IGNORE INTO reuse_texts VALUES (?, ?)",
                           [(bytes.fromhex(h), row[0]) for h in text_hashes])  # fmt: skip

    def forget_objects(self, output_uri: str, object_keys: Sequence[str]) -> None:
        """Drop objects (deleted from the store) from the reuse index."""
        with self.atomic() as db:
            for key in object_keys:
                row = db.execute(
                    "DELETE FROM reuse_objects WHERE output_uri = ? AND object_key = ? "
                    "RETURNING object_id", (output_uri, key)).fetchone()  # fmt: skip
                if row is not None:
                    db.execute("DELETE FROM reuse_texts WHERE object_id = ?", (row[0],))

    def find_vectors(
        self, output_uri: str, *, model: str, dimensions: str, text_hashes: Sequence[str]
    ) -> dict[str, str]:
        """Return ``{text hash: object key}`` for the texts some indexed object holds with
        this model and requested dimensions ("" when unset); the others are absent. Where
        several objects hold a text, the first indexed one wins.

        One query per ``_LOOKUP_BATCH`` hashes, none when no object of this output, model
        and dimensions is indexed (a first run): a query per text cost about 47 ms per
        1,000-row chunk beside busy chunk threads (each call hands the GIL back and forth),
        which made the single dispatcher thread the bottleneck of the whole run.
        """
        wanted = list(dict.fromkeys(text_hashes))
        found: dict[str, tuple[int, str]] = {}
        with self._lock:
            objects = self._conn.execute(
                "SELECT 1 FROM reuse_objects WHERE output_uri = ? AND model = ? "
                "AND dimensions = ? LIMIT 1", (output_uri, model, dimensions)).fetchone()  # fmt: skip
            if objects is None:
                return {}
            for start in range(0, len(wanted), _LOOKUP_BATCH):
                batch = [bytes.fromhex(h) for h in wanted[start:start + _LOOKUP_BATCH]]
                rows = self._conn.execute(
                    # CROSS JOIN keeps reuse_texts the outer loop (its primary key answers
                    # the IN list); the planner's own choice scanned the objects first:
                    # 41 ms instead of 4 ms per 1,000 texts over 192 indexed objects
                    f"""SELECT t.text_sha256, o.object_id, o.object_key FROM reuse_texts t
                        CROSS JOIN reuse_objects o ON o.object_id = t.object_id
                        WHERE t.text_sha256 IN ({", ".join("?" * len(batch))})
                          AND o.output_uri = ? AND o.model = ? AND o.dimensions = ?""",
                    (*batch, output_uri, model, dimensions),
                ).fetchall()
                for digest, object_id, object_key in rows:
                    text_hash = digest.hex()
                    if text_hash not in found or object_id < found[text_hash][0]:
                        found[text_hash] = (object_id, object_key)
        return {text_hash: key for text_hash, (_, key) in found.items()}

    def forget_collected(
        self,
        output_uri: str,
        *,
        object_keys: Sequence[str],
        object_uris: Sequence[str],
        manifest_uris: Sequence[str],
    ) -> None:
        """Drop rows that refer to objects garbage collection deleted under ``output_uri``:
        published objects (so no run skips a chunk that is gone), the reuse index, dead
        letters of chunk keys no recorded object has any more; runs whose manifest was
        deleted become ``collected``."""
        self.forget_objects(output_uri, object_keys)
        with self.atomic() as db:
            for uri in object_uris:
                row = db.execute("DELETE FROM objects WHERE object_uri = ? RETURNING chunk_key",
                                 (uri,)).fetchone()  # fmt: skip
                if row is not None:
                    db.execute("""DELETE FROM dead_letters WHERE chunk_key = ? AND NOT EXISTS
                                  (SELECT 1 FROM objects WHERE chunk_key = ?)""",
                               (row[0], row[0]))  # fmt: skip
                db.execute("""UPDATE chunks SET state = 'pending', updated_at = ?
                              WHERE object_uri = ? AND state = 'published'""",
                           (_now_iso(), uri))  # fmt: skip
            db.executemany("UPDATE runs SET status = 'collected' WHERE manifest_uri = ?",
                           [(u,) for u in manifest_uris])  # fmt: skip


def record_hard_stop(ledger_path: str, run_key: str) -> None:
    """Mark run ``run_key`` ``interrupted`` if it is still ``running``: called from any
    thread just before the command ends abruptly (a second signal, an interrupt before the
    flow took over, the Prefect API lost before dispatching), on a connection of its own
    that waits at most 1 s (the stopped thread may hold the write lock; ``status`` then
    finds the process gone and says ``crashed``). Never raises."""
    try:
        ledger = Ledger(ledger_path, busy_timeout_s=1.0)
        try:
            ledger.mark_stopped(run_key)
        finally:
            ledger.close()
    except sqlite3.Error:
        pass
