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
  attempts. Dead letters are final for that content (docs/reference/output-layout.md,
  "Generations").
- ``sink_loads`` (migration ``0004_sinks``): one row per (sink, run key) load: ``loading`` or
  ``loaded``, mode (``replace`` or ``changes``), rows upserted and deleted.
- ``batches`` (migration ``0007_batches``): one row per Batch API batch of a run's chunk
  (``adapters/ledger/batches.py``): written before and after its create.
- ``sink_chunks``: one row per chunk of a run loaded into a sink (written after the sink's
  transaction committed). Both are a cache of what loads did: what a sink holds is decided
  by the sink's own rows (docs/reference/sinks.md, ``tasks/load/sink_state.py``), never by these
  tables.
- ``reuse_objects`` / ``reuse_buckets`` (the reuse index, docs/reference/ledger.md, migration
  ``0011_reuse_buckets``): which chunk objects under which output root hold a vector for
  which text, and at which row, by (output URI, model, requested dimensions as in the row
  key: "" or decimal): per object and hash bucket, the texts' 64-bit hash prefixes and row
  positions as packed arrays, about 12 bytes a row, read a bucket at a time. A cache of the
  store: rebuilt from the chunk objects' ``text_sha256`` columns when it misses any.
- ``token_calibration`` (migration ``0012_token_calibration``): per endpoint (``--base-url``)
  and model, the tokens the servers' answers reported and the estimate of the same texts,
  summed over runs: what ``run --dry-run`` scales its estimate by (``embedline.calibration``).

Modules: ``migrations`` (the schema, named once-only migrations), ``base`` (connection,
``atomic``), one module per table group (``runs``, ``chunks``, ``objects``, ``sink_loads``,
``reuse_index``, ``calibration``), ``records`` (their rows), ``owners`` (``host:pid:random``
process ids).
``Ledger`` joins them: import it from here.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from adapters.ledger.base import now_iso
from adapters.ledger.batches import BatchRecord, BatchTable
from adapters.ledger.calibration import CalibrationTable
from adapters.ledger.chunks import ChunkTable
from adapters.ledger.migrations import SCHEMA_VERSION
from adapters.ledger.objects import ObjectTable
from adapters.ledger.owners import new_owner
from adapters.ledger.records import ChunkRecord, ObjectRecord, RunRecord, SinkLoadRecord
from adapters.ledger.reuse_index import ReuseIndex
from adapters.ledger.runs import RunTable
from adapters.ledger.sink_loads import SinkLoadTable

__all__ = [
    "SCHEMA_VERSION",
    "BatchRecord",
    "ChunkRecord",
    "Ledger",
    "ObjectRecord",
    "RunRecord",
    "SinkLoadRecord",
    "new_owner",
    "record_hard_stop",
]


class Ledger(
    RunTable, ChunkTable, ObjectTable, SinkLoadTable, ReuseIndex, BatchTable, CalibrationTable
):
    """The run ledger in one SQLite file (``":memory:"`` for tests): ``Ledger(path,
    busy_timeout_s=30.0)``; one method per transition, grouped by table in the base classes.

    Thread-safe: one connection guarded by a lock, so the flow process's threads (dispatch,
    signal handling) may share it. ``busy_timeout_s`` (seconds) bounds the wait for another
    process's write lock.

    :raises sqlite3.DatabaseError: if the file is not a SQLite database.
    :raises DiskFullError: (exit 1) the ledger's filesystem is full, at open, migration, any
        write or the WAL checkpoint (``adapters.disk_full.LedgerConnection``).
    """

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
                row = db.execute(
                    "DELETE FROM objects WHERE object_uri = ? RETURNING chunk_key", (uri,)
                ).fetchone()
                if row is not None:
                    db.execute(
                        """DELETE FROM dead_letters WHERE chunk_key = ? AND NOT EXISTS
                                  (SELECT 1 FROM objects WHERE chunk_key = ?)""",
                        (row[0], row[0]),
                    )
                db.execute(
                    """UPDATE chunks SET state = 'pending', updated_at = ?
                              WHERE object_uri = ? AND state = 'published'""",
                    (now_iso(), uri),
                )
            db.executemany(
                "UPDATE runs SET status = 'collected' WHERE manifest_uri = ?",
                [(u,) for u in manifest_uris],
            )


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
