"""The ledger's schema: named migrations, each applied once, in order (like sqlite-utils'
``migrations.py``).

``meta`` holds ``schema_version`` and one ``migration:NAME`` row per applied migration; a new
migration is appended to ``MIGRATIONS`` (never edited once released) and raises
``SCHEMA_VERSION`` by one.
"""

from __future__ import annotations

import sqlite3

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

MIGRATIONS: tuple[tuple[str, str], ...] = (
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

MIGRATIONS += (
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

MIGRATIONS += (
    (
        # Rows a sink refuses for good (docs/reference/sinks.md): load dead letters, listed by
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

MIGRATIONS += (
    (
        # Batch API mode (docs/reference/ledger.md, ``adapters/ledger/batches.py``): one row per
        # batch a chunk of a run submitted, written before its create (state ``creating``) and
        # after it (``submitted``, with the provider's id), so a crash or a failed create is
        # adopted from the provider's list instead of submitted again.
        "0007_batches",
        """
        CREATE TABLE batches (
            run_key TEXT NOT NULL,
            idx INTEGER NOT NULL,
            part INTEGER NOT NULL,
            chunk_key TEXT NOT NULL,
            req_start INTEGER,
            req_stop INTEGER,
            state TEXT NOT NULL CHECK (state IN ('creating', 'submitted')),
            batch_id TEXT,
            status TEXT,
            input_file_id TEXT,
            output_file_id TEXT,
            error_file_id TEXT,
            requests INTEGER NOT NULL,
            inputs INTEGER NOT NULL,
            completed INTEGER NOT NULL DEFAULT 0,
            failed INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (run_key, idx, part)
        ) STRICT;
        CREATE UNIQUE INDEX batches_by_id ON batches (batch_id);
        """,
    ),
    (
        # What a committed run did (``flows.events.run_payload``: counts, tokens, cost, the
        # change set's counts), for ``status --json``: the same facts as the
        # ``embedline.run.committed`` event, without reading the manifest from the store.
        "0008_run_facts",
        "ALTER TABLE runs ADD COLUMN facts_json TEXT;",
    ),
)

MIGRATIONS += (
    (
        # A batch id is unique within one provider account only, and one ledger serves any
        # --base-url (gateways, self-hosted servers, accounts): unique per run, not overall
        # (unique overall, a second server's "batch_000002" fails every rerun on the index).
        "0009_batch_ids_per_run",
        """
        DROP INDEX batches_by_id;
        CREATE UNIQUE INDEX batches_by_run_id ON batches (run_key, batch_id);
        """,
    ),
)

MIGRATIONS += (
    (
        # What each batch carried (docs/reference/ledger.md): its requests as ``[[custom_id, [row
        # positions]], ...]`` JSON, written with the part before its create, because a rerun
        # overwrites the run's settings: derived from them, a rerun with another
        # --batch-size or --batch-max-inputs matches no answer ("… texts have no answer")
        # and --batch-fallback sync pays for them again. NULL: a part recorded before this
        # migration, whose layout is derived from the run's settings.
        "0010_batch_layouts",
        "ALTER TABLE batches ADD COLUMN layout TEXT;",
    ),
)

MIGRATIONS += (
    (
        # The reuse index as hash buckets (docs/reference/ledger.md): one row per (object, bucket)
        # holding the 64-bit prefixes of its texts' SHA-256s and their row positions, so a
        # run joins all its texts against the index bucket by bucket (numpy, flat memory)
        # and takes each vector by position; indexing an object is 64 inserts, not one per
        # row into a B-tree of random keys (9 s per million rows). The index is a cache of
        # the store: the old rows are dropped and the next run re-indexes from the objects.
        "0011_reuse_buckets",
        """
        DROP TABLE IF EXISTS reuse_texts;
        DELETE FROM reuse_objects;
        DROP TABLE IF EXISTS reuse_buckets;
        CREATE TABLE reuse_buckets (
            bucket INTEGER NOT NULL,
            object_id INTEGER NOT NULL,
            prefixes BLOB NOT NULL,
            positions BLOB NOT NULL,
            PRIMARY KEY (bucket, object_id)
        ) STRICT, WITHOUT ROWID;
        CREATE INDEX reuse_buckets_by_object ON reuse_buckets (object_id);
        """,
    ),
)

MIGRATIONS += (
    (
        # Token estimates calibrated by what servers reported (docs/reference/ledger.md,
        # ``embedline.calibration``): per endpoint (--base-url) and model, the tokens the
        # answers' ``usage`` reported and the estimate of the same texts, both summed over
        # runs; a dry run scales its estimate by their ratio. Counts only, never a text.
        "0012_token_calibration",
        """
        CREATE TABLE token_calibration (
            base_url TEXT NOT NULL,
            model TEXT NOT NULL,
            tokens_reported INTEGER NOT NULL,
            tokens_estimated INTEGER NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (base_url, model)
        ) STRICT;
        """,
    ),
    (
        # One batch packs the parts of many chunks (``flows/batch_stage.py``): each part keeps
        # its row, and the parts a batch packs share its id, so the id is no longer unique
        # within a run; still looked up by it (each poll updates every part it packs).
        "0013_packed_batches",
        """
        DROP INDEX batches_by_run_id;
        CREATE INDEX batches_by_run_id ON batches (run_key, batch_id);
        """,
    ),
)

#: One more per migration; migrations are applied by name, each once, in tuple order.
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection, *, now: str) -> None:
    """Apply the migrations ``db`` lacks and record them (``now``: UTC ISO-8601), then store
    ``SCHEMA_VERSION``. Call inside one transaction (``Ledger.atomic``): all or none apply.

    :raises sqlite3.DatabaseError: the file is not a SQLite database.
    """
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT) STRICT")
    done = {r[0] for r in db.execute("SELECT key FROM meta WHERE key LIKE 'migration:%'")}
    for name, sql in MIGRATIONS:
        if f"migration:{name}" in done:
            continue
        for statement in filter(str.strip, sql.split(";")):
            db.execute(statement)
        db.execute("INSERT INTO meta VALUES (?, ?)", (f"migration:{name}", now))
    db.execute(
        "INSERT INTO meta VALUES ('schema_version', ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (str(SCHEMA_VERSION),),
    )
