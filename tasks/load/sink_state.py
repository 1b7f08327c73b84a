"""What a sink holds against what a run contains: the record every load decides by
(docs/reference/sinks.md).

The sink's own rows are the record: each row's ``id`` and ``text_sha256`` (written in the
same transaction, or LanceDB commit, as its vector), and in a table with kept columns each
row's ``kept_sha256`` (so a metadata-only edit is a row the sink does not hold yet). A load
compares them with the run's
``id`` and ``text_sha256`` columns (read from the chunk objects, never the vectors):

- rows to upsert: the run's rows whose ``(id, text_sha256)`` the sink does not hold (absent,
  removed by someone else, or holding another text);
- ids to delete: the ids the sink holds that the run does not contain.

A row the sink holds with the same id and text is the run's row: the table is pinned to one
model and length (``check_compatible``), and a text's vector under one model is the one the
change sets already assume (an ``unchanged`` id is never reloaded). So whatever any ledger,
machine or interrupted load did before, the plan takes the table to exactly the run, and
"already loaded" means the table holds exactly the run's ids and texts. The ledger's
``sink_loads``/``sink_chunks`` are a cache of what loads did, never consulted to decide.

Memory: about 100 bytes a row for each side (1M rows: ~200 MB of Arrow strings).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from adapters.sinks.base import KEPT_HASH, sink_columns_of
from embedline.delete_share import (
    DEFAULT_MAX_DELETE_FRACTION,
    MassDeleteError,
    check_delete_share,
)
from embedline.errors import ConflictError
from embedline.protocols import ObjectStore, SinkColumns, VectorSink
from tasks.commit.changes import read_entry_keys

__all__ = [
    "DEFAULT_MAX_DELETE_FRACTION",
    "LoadPlan",
    "MassDeleteError",
    "check_delete_share",
    "ensure_run_table",
    "left_to_load",
    "load_mode",
    "plan_load",
    "run_keys",
]


def run_keys(
    store: ObjectStore, chunks: Sequence[dict[str, Any]], kept_columns: Sequence[str] = ()
) -> pa.Table:
    """The run's ``id``, ``text_sha256`` (strings), with ``kept_columns`` ``kept_sha256``
    (the held key's part, ``adapters.sinks.base.kept_hashes``), and ``chunk`` (int32: the
    manifest chunk's index) from its chunk objects' key columns (16 objects read at once),
    without the rows an entry drops (``drop_ids``)."""
    with_rows = [c for c in chunks if int(c["rows"])]
    with ThreadPoolExecutor(16) as pool:
        tables = list(pool.map(lambda c: read_entry_keys(store, c, kept_columns), with_rows))
    parts = [
        t.append_column("chunk", pa.array([int(c["index"])] * t.num_rows, pa.int32()))
        for c, t in zip(with_rows, tables, strict=True)
    ]
    if not parts:
        names = ["id", "text_sha256"] + ([KEPT_HASH] if kept_columns else [])
        return pa.table(
            {**{n: pa.array([], pa.string()) for n in names}, "chunk": pa.array([], pa.int32())}
        )
    return pa.concat_tables(parts)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What takes a sink to exactly a run: ``upsert`` ids per chunk index (rows the sink
    lacks), ``delete`` ids (held, not in the run), and ``held`` rows at the time of reading."""

    upsert: dict[int, frozenset[str]]
    delete: list[str]
    held: int

    @property
    def rows_to_upsert(self) -> int:
        """Rows the plan upserts."""
        return sum(len(v) for v in self.upsert.values())

    @property
    def done(self) -> bool:
        """True when the sink already holds exactly the run."""
        return not self.upsert and not self.delete


def plan_load(run: pa.Table, held: pa.Table) -> LoadPlan:
    """Compare ``run`` (``run_keys``) with ``held`` (``VectorSink.held_keys``) by ``id``,
    ``text_sha256`` and, where both have it, ``kept_sha256``: a row whose kept values
    changed is upserted though its text did not."""
    key = ["id", "text_sha256"] + (
        [KEPT_HASH] if KEPT_HASH in run.column_names and KEPT_HASH in held.column_names else []
    )
    held = held.select(key)
    missing = run.join(held, keys=key, join_type="left anti")
    upsert: dict[int, set[str]] = {}
    for chunk, row_id in zip(
        missing.column("chunk").to_pylist(), missing.column("id").to_pylist(), strict=True
    ):
        upsert.setdefault(int(chunk), set()).add(str(row_id))
    gone = held.select(["id"]).join(run.select(["id"]), keys="id", join_type="left anti")
    ids = pc.unique(gone.column("id")).to_pylist() if gone.num_rows else []
    return LoadPlan(
        {k: frozenset(v) for k, v in sorted(upsert.items())}, sorted(map(str, ids)), held.num_rows
    )


def ensure_run_table(sink: VectorSink, manifest: dict[str, Any]) -> SinkColumns:
    """Create the run's table in ``sink`` if absent (its model, length and the columns the
    run carries, from ``manifest``); the columns.

    :raises FatalError: the table exists with another model, length or columns (exit 3).
    """
    columns = sink_columns_of(manifest)
    sink.ensure_table(
        embedder=str(manifest.get("embedder")),
        model=str(manifest["model"]),
        dimensions=int(manifest["dimensions"]),
        columns=columns,
    )
    return columns


def left_to_load(
    store: ObjectStore, manifest: dict[str, Any], sink: VectorSink, columns: SinkColumns
) -> tuple[pa.Table, LoadPlan]:
    """What is left to load run ``manifest`` (published in ``store``) into ``sink``, whose
    table ``ensure_run_table`` made sure of: the run's keys (``run_keys``) and the plan
    from what the sink holds now (``plan_load``; ``LoadPlan.done``: nothing). The one load
    plan: the load stage applies it, ``embedline run`` and ``load`` ask it before Prefect.

    :raises EmbedlineError: the store or the sink failed; ``FileNotFoundError``: a chunk
        object is gone.
    """
    run = run_keys(store, manifest["chunks"], columns.kept)
    return run, plan_load(run, sink.held_keys())


def load_mode(store: ObjectStore, manifest: dict[str, Any], plan: LoadPlan) -> str:
    """``changes`` when what the sink lacks and holds beyond the run is exactly the run's
    change set (the sink holds the change set's base run), else ``replace``."""
    changes = manifest.get("changes") or {}
    if not changes.get("base_run_key"):
        return "replace"
    try:
        table = _change_set(store, changes)
    except FileNotFoundError:  # collected: the plan does not need it
        return "replace"
    upsert = pc.is_in(table.column("change"), pa.array(["added", "changed"]))
    removed = pc.equal(table.column("change"), "removed")
    same = (
        set(table.filter(upsert).column("id").to_pylist())
        == {i for ids in plan.upsert.values() for i in ids}
        and sorted(table.filter(removed).column("id").to_pylist()) == plan.delete
    )
    return "changes" if same else "replace"


def _change_set(store: ObjectStore, changes: dict[str, Any]) -> pa.Table:
    """The run's change set (``id``, ``change``, ``text_sha256``), checked by SHA-256.

    :raises ConflictError: the object's bytes differ from the manifest's record.
    """
    body = store.get(str(changes["object"]))
    if hashlib.sha256(body).hexdigest() != changes["sha256"]:
        raise ConflictError(
            f"{store.uri_for(str(changes['object']))} does not match its manifest's SHA-256"
        )
    return pq.read_table(io.BytesIO(body), columns=["id", "change"])
