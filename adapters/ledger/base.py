"""The ledger's connection, transactions and schema upgrade on open; the tables' classes
(``runs``, ``chunks``, ``objects``, ``sink_loads``, ``reuse_index``) build on it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime

from adapters.disk_full import LedgerConnection, translate_full
from adapters.ledger.migrations import migrate
from embedline.errors import DiskFullError
from embedline.exit_cleanups import exit_cleanup

__all__ = ["LedgerBase", "now_iso"]


def now_iso() -> str:
    """Return the current UTC time as ISO-8601 with microseconds (``...T12:00:00.000000Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LedgerBase:
    """The ledger's connection: one SQLite file (``":memory:"`` for tests), migrated on open.

    Thread-safe: one connection guarded by a lock, so the flow process's threads (dispatch,
    signal handling) may share it. ``busy_timeout_s`` (seconds) bounds the wait for another
    process's write lock.

    ``_conn`` is the connection (autocommit: every write goes through ``atomic`` or is a single
    statement under ``_lock``).

    :raises sqlite3.DatabaseError: if the file is not a SQLite database.
    :raises DiskFullError: (exit 1) the ledger's filesystem is full, at open, migration, any
        write or the WAL checkpoint (``adapters.disk_full.LedgerConnection``).
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0) -> None:
        self.path = os.fspath(path)
        with translate_full(self.path, "ledger"):  # creating the file, WAL and migrations
            if self.path != ":memory:":
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._conn = sqlite3.connect(
                self.path,
                timeout=busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
                factory=LedgerConnection,
            )
            self._conn.ledger_path = self.path  # every statement: a full disk, one line
            self._conn.row_factory = sqlite3.Row
            self._lock = threading.RLock()
            self._depth = 0
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        _open[self._conn] = self._lock

    def close(self) -> None:
        """Close the connection. A full filesystem is ignored here: the WAL that could not be
        checkpointed is replayed by the next open, so nothing is lost."""
        with self._lock, contextlib.suppress(DiskFullError):
            self._conn.close()
        _open.pop(self._conn, None)

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
            migrate(db, now=now_iso())

    def schema_version(self) -> int:
        """Return the schema version stored in ``meta``."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])


#: Ledger connections open in this process, with their ledger's lock. The CLI ends with
#: ``os._exit`` once the exit handlers ran (``cli.entry``), which skips closing them (a
#: connection outlives its ``Ledger`` when something else holds it): SQLite then left
#: ``-wal`` and ``-shm`` files beside the ledger after every ``status`` or ``search``.
#: Closing the last connection checkpoints the WAL and removes both
#: (https://sqlite.org/wal.html, "WAL file").
_open: weakref.WeakKeyDictionary[sqlite3.Connection, threading.RLock] = weakref.WeakKeyDictionary()


@exit_cleanup
def _close_open_ledgers() -> None:
    """Close each connection no thread holds (never wait at exit)."""
    for conn, lock in list(_open.items()):
        if lock.acquire(blocking=False):
            try:
                with contextlib.suppress(DiskFullError, sqlite3.Error):
                    conn.close()
            finally:
                lock.release()
