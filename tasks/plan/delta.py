"""Delta nights: a night that writes only what changed since the dataset's last committed run
(docs/design.md, "Delta nights"; the manifest's form: docs/reference/output-layout.md).

After planning, each input row is looked up once, by id, among the rows the base run (the
latest committed run of the same dataset) takes from its objects:

- same text and kept values: **unchanged**, not written — the new manifest inherits the
  base's entry for its object;
- a new id, or another text or other kept values: written to a **delta chunk** (rows to
  write, ``chunk_size`` per chunk, in input order, keyed by the contract's chunk key over
  its own rows), and its base row dropped from the inherited entry (``drop_ids``);
- a base id gone from the input, or now an empty text: dropped (``removed``).

The change set falls out of the same lookup. The rows to write replace the planned chunks:
the reuse stage, the chunk tasks and the ledger see delta chunks as chunks (their
``ChunkSpec.parts`` say which planned rows they read). A night whose inherited objects would
hold more dropped rows than ``MAX_DROPPED_SHARE`` of its rows writes whole objects instead:
that night is the compaction.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adapters.ledger.reuse_index import bucket_of
from adapters.row_facts import CHUNK_ROWS, ROW_DTYPE, chunk_rows
from adapters.scratch import (
    Scratch,
    hash_prefixes,
    release,
)
from embedline.delete_share import check_delete_share
from embedline.errors import ConflictError
from embedline.keys import ChunkKeyBuilder, rows_sha256
from embedline.models import ChunkPart, ChunkSpec, DeltaBase, InputPlan
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from tasks.commit.changes import CHANGES_SCHEMA
from tasks.commit.manifest import latest_manifest
from tasks.plan.delta_lookup import look_up

__all__ = [
    "CHANGES_FILE",
    "EMPTIES_FILE",
    "MAX_DROPPED_SHARE",
    "delta_base",
    "delta_night",
    "plan_delta",
]

#: The compaction bound: a night inherits objects only while the rows they hold but the run
#: drops stay within this share of the run's rows (read amplification at most 1.25: a reader
#: reads 25 % more rows than it keeps). Past it the night writes whole objects. At 0.5 % of
#: rows edited a night, that is a compaction every 40 nights or so.
MAX_DROPPED_SHARE = 0.25
#: The change set's rows, written beside the delta's chunk rows in its scratch directory.
CHANGES_FILE = "changes.parquet"
#: The night's empty texts (``id``, ``row``: 1-based record number), which no chunk holds:
#: its ``empty_text`` dead letters, recorded in the ledger when the night commits.
EMPTIES_FILE = "empties.parquet"


def delta_base(store: ObjectStore, plan: InputPlan, settings: RunSettings) -> dict[str, Any] | None:
    """The committed run a night of ``plan`` can be a delta of, or None (a full night).

    A delta needs: the planning pass's rows (``plan.scratch``), reuse on, no Batch API, no
    ``--compact``, and a committed run of the same dataset (columns, template, kept columns,
    text kept or not, model, requested dimensions) whose only dead letters are empty texts
    (a rejected row is retried by a full night, never carried) and whose objects hold few
    enough dropped rows (``MAX_DROPPED_SHARE``).
    """
    if plan.scratch is None or not settings.reuse or settings.batch_api or settings.compact:
        return None
    if settings.on_empty_text == "fail":  # empty texts must reach a chunk to block it
        return None
    source = plan.source
    base = latest_manifest(
        store,
        id_column=source.id_column,
        text_column=source.text_column,
        model=settings.effective_model,
        dimensions=settings.dimensions,
    )
    if base is None:
        return None
    template = base.get("text_template") or f"{{{source.text_column}}}"
    wanted = source.text_template or f"{{{source.text_column}}}"
    same_documents = (
        template == wanted
        and tuple(base.get("kept_columns") or ()) == source.kept_columns
        and bool(base.get("keep_text")) == source.keep_text
    )
    dead = base.get("dead_letters")
    failed = int(base["rows_failed"]) - int((dead or {}).get("empty_text", 0))
    if not same_documents or failed or (dead is None and int(base["rows_failed"])):
        return None
    if _dropped(base) > MAX_DROPPED_SHARE * max(int(base["rows_published"]), 1):
        return None
    return base


def delta_night(
    store: ObjectStore, plan: InputPlan, settings: RunSettings, *, log: Any
) -> InputPlan:
    """``plan`` as a delta night (``plan_delta``) when ``delta_base`` finds a run to inherit
    from, else ``plan`` itself (a full night). An object of the base that is gone or not
    what its manifest says makes the night a full one, said in ``log``; nothing is lost."""
    base = delta_base(store, plan, settings)
    if base is None:
        return plan
    try:
        night = plan_delta(store, plan, settings, base)
    except (FileNotFoundError, ConflictError) as exc:
        log.warning("a full night, not a delta of run %s: %s", str(base["run_key"])[:12], exc)
        return plan
    if night is None or night.delta is None:
        log.info(
            "a full night: run %s's objects hold too many dropped rows (a compaction)",
            str(base["run_key"])[:12],
        )
        return plan
    d = night.delta
    log.info(
        "delta night against run %s: %s rows to write in %d chunks (%s added, %s changed, "
        "%s removed, %s unchanged)",
        d.base_run_key[:12],
        f"{sum(c.rows for c in night.chunks):,}",
        len(night.chunks),
        *(f"{n:,}" for n in (d.added, d.changed, d.removed, d.unchanged)),
    )
    return night


def _dropped(manifest: dict[str, Any]) -> int:
    """Rows a manifest's objects hold that the run does not take."""
    return sum(len(c.get("drop_ids") or ()) for c in manifest["chunks"])


def plan_delta(
    store: ObjectStore, plan: InputPlan, settings: RunSettings, base: dict[str, Any]
) -> InputPlan | None:
    """The delta night of ``plan`` against the committed run ``base`` (``delta_base``): a plan
    whose chunks are the delta chunks, whose ``scratch`` is a new directory holding their
    rows (the planning pass's is released) and whose ``delta`` says what the manifest
    inherits; None when the night should write whole objects (past ``MAX_DROPPED_SHARE``).

    The change set's removals are checked against ``--max-delete-fraction`` here, before
    anything is sent (a cut-short export is refused before it is paid for), and again when
    the night commits.

    :raises FileNotFoundError: an object of ``base`` is gone (the caller runs a full night).
    :raises ConflictError: an object of ``base`` does not hold the rows its manifest says.
    :raises MassDeleteError: the night would remove more than ``--max-delete-fraction`` of
        the base's rows (exit 2; nothing sent, nothing written).
    :raises DiskFullError: the scratch directory's filesystem is full.
    """
    assert plan.scratch is not None
    scratch = Scratch.create(Path(plan.scratch).parent.parent)  # {root}/scratch/{token}
    try:
        found = look_up(store, plan, base, scratch)
        check_delete_share(
            found.counts["removed"],
            int(base["rows_published"]),
            settings.max_delete_fraction,
            kept="nothing sent, nothing committed",
            what=f"this night's change set against run {str(base['run_key'])[:12]}",
        )
        inherited = _inherited(base, found.drops)
        at = pa.concat_tables(found.written) if found.written else None
        written = _written_rows(plan, at) if at is not None and at.num_rows else None
        rows_written = written.num_rows if written is not None else 0
        taken = sum(int(c["rows"]) for c in inherited)
        dropped = sum(len(c.get("drop_ids") or ()) for c in inherited)
        if dropped > MAX_DROPPED_SHARE * max(taken + rows_written, 1):
            scratch.close()
            return None
        chunks = _delta_chunks(plan, written, settings) if written is not None else []
        _write_rows(scratch, plan, written, settings.chunk_size)
        changes = pa.concat_tables(found.changes) if found.changes else CHANGES_SCHEMA.empty_table()
        pq.write_table(changes.sort_by("id"), scratch.file(CHANGES_FILE))
        pq.write_table(_empty_rows(plan, found.empties), scratch.file(EMPTIES_FILE))
    except BaseException:
        scratch.close()
        raise
    delta = DeltaBase(
        base_run_key=str(base["run_key"]),
        base_rows=int(base["rows_published"]),
        dimensions=int(base["dimensions"]),
        inherited=tuple(inherited),
        rows_inherited=taken,
        rows_empty=found.counts["empty"],
        added=found.counts["added"],
        changed=found.counts["changed"],
        removed=found.counts["removed"],
        unchanged=found.counts["unchanged"],
    )
    release(plan.scratch)
    return replace(plan, chunks=tuple(chunks), scratch=str(scratch.path), delta=delta)


_ROW_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text_sha256", pa.string()),
        ("utf8_bytes", pa.int32()),
        ("empty", pa.bool_()),
        ("kept_sha256", pa.string()),
        ("line", pa.int64()),
        ("last_line", pa.int64()),
        ("chunk", pa.int32()),
        ("position", pa.int32()),
    ]
)


def _written_rows(plan: InputPlan, at: pa.Table) -> pa.Table:
    """The rows to write, whole (``_ROW_SCHEMA``), in input order: read back from planning's
    ``chunks.arrow`` at their ``chunk`` and ``position`` (``at``)."""
    assert plan.scratch is not None
    at = at.sort_by([("chunk", "ascending"), ("position", "ascending")])
    chunks = at.column("chunk").to_numpy()
    positions = at.column("position").to_numpy()
    tables = []
    for rows in _runs(chunks):
        chunk, taken = int(chunks[rows[0]]), positions[rows]
        batch = chunk_rows(plan.scratch, chunk).take(pa.array(taken))
        table = pa.Table.from_batches([batch])
        table = table.append_column(
            "chunk", pa.repeat(pa.scalar(chunk, pa.int32()), len(taken))
        ).append_column("position", pa.array(taken, pa.int32()))
        tables.append(table.cast(_ROW_SCHEMA))
    return pa.concat_tables(tables)


def _runs(chunks: np.ndarray) -> list[np.ndarray]:
    """The positions in ``chunks`` (planned chunk indexes, in input order) of each run of one
    chunk."""
    return np.split(np.arange(len(chunks)), np.flatnonzero(np.diff(chunks)) + 1)


def _empty_rows(plan: InputPlan, empties: list[pa.Table]) -> pa.Table:
    """``EMPTIES_FILE``'s table: each empty text's ``id`` and 1-based ``row``, in row order."""
    first_rows = np.asarray([c.first_row for c in plan.chunks], dtype=np.int64)
    ids: list[str] = []
    rows: list[np.ndarray] = []
    for table in empties:
        ids += table.column("id").to_pylist()
        chunks = table.column("chunk").to_numpy(zero_copy_only=False).astype(np.int64)
        positions = table.column("position").to_numpy(zero_copy_only=False).astype(np.int64)
        rows.append(first_rows[chunks] + positions)
    row = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return pa.table({"id": pa.array(ids, pa.string()), "row": row}).sort_by("row")


def _inherited(base: dict[str, Any], drops: dict[int, list[str]]) -> list[dict[str, Any]]:
    """The base's entries the night keeps, each with the ids it now drops (``drops``, by the
    entry's position) added to its ``drop_ids`` (sorted) and ``rows`` lowered to match;
    entries left without a row go."""
    kept = []
    for i, entry in enumerate(base["chunks"]):
        dropped = drops.get(i, [])
        rows = int(entry["rows"]) - len(dropped)
        if rows <= 0:
            continue
        entry = dict(entry)
        if dropped:
            entry["drop_ids"] = sorted([*(entry.get("drop_ids") or ()), *dropped])
            entry["rows"] = rows
        kept.append(entry)
    return kept


def _delta_chunks(plan: InputPlan, written: pa.Table, settings: RunSettings) -> list[ChunkSpec]:
    """The delta chunks: ``written`` (rows to write, in input order) cut every
    ``chunk_size`` rows; each keyed over its own rows (docs/reference/keys.md, "Chunk key")."""
    source, size = plan.source, settings.chunk_size
    columns = source.key_lines
    specs = []
    for index, start in enumerate(range(0, written.num_rows, size)):
        part = written.slice(start, size)
        key = ChunkKeyBuilder(settings.effective_model, settings.dimensions, columns)
        facts = (
            part.column("id").to_pylist(),
            part.column("text_sha256").to_pylist(),
            part.column("kept_sha256").to_pylist() if source.kept_columns else None,
        )
        key.add_many(*facts)
        parts = _parts(plan, part)
        specs.append(
            ChunkSpec(
                index=index,
                key=key.hexdigest(),
                first_row=parts[0].first_row + parts[0].positions[0],
                line_start=parts[0].line_start,
                rows=part.num_rows,
                byte_start=parts[0].byte_start,
                byte_stop=parts[-1].byte_stop,
                bytes_sha256="",
                parts=tuple(parts),
                rows_sha256=rows_sha256(*facts),
            )
        )
    return specs


def _parts(plan: InputPlan, rows: pa.Table) -> list[ChunkPart]:
    """The planned chunks ``rows`` (in input order) come from, with their positions."""
    chunks = rows.column("chunk").to_numpy()
    positions = rows.column("position").to_numpy()
    lines, last_lines = rows.column("line"), rows.column("last_line")
    known = lines.null_count == 0 and last_lines.null_count == 0
    parts = []
    for chunk_rows_at in _runs(chunks):
        planned = plan.chunks[int(chunks[chunk_rows_at[0]])]
        at = pa.array(chunk_rows_at)
        parts.append(
            ChunkPart(
                first_row=planned.first_row,
                line_start=planned.line_start,
                rows=planned.rows,
                byte_start=planned.byte_start,
                byte_stop=planned.byte_stop,
                bytes_sha256=planned.bytes_sha256,
                positions=tuple(int(p) for p in positions[chunk_rows_at]),
                lines=tuple(lines.take(at).to_pylist()) if known else (),
                last_lines=tuple(last_lines.take(at).to_pylist()) if known else (),
            )
        )
    return parts


def _write_rows(
    scratch: Scratch, plan: InputPlan, written: pa.Table | None, chunk_size: int
) -> None:
    """The delta chunks' rows in ``scratch`` as planning writes a plan's (``adapters.row_facts``):
    ``chunks.arrow`` (batch i: delta chunk i's rows) and the ``rows`` spill of text-hash
    prefixes by (delta chunk, position), which the reuse stage joins."""
    with pa.memory_map(str(Path(str(plan.scratch)) / CHUNK_ROWS)) as planned:
        schema = pa.ipc.open_file(planned).schema
    spill = scratch.spill("rows", ROW_DTYPE)
    with pa.ipc.new_file(str(scratch.file(CHUNK_ROWS)), schema) as writer:
        for index, start in enumerate(range(0, written.num_rows if written else 0, chunk_size)):
            assert written is not None
            part = written.slice(start, chunk_size)
            batch = pa.record_batch(
                [part.column(n).combine_chunks() for n in schema.names], schema=schema
            )
            writer.write_batch(batch)
            records = np.empty(part.num_rows, dtype=ROW_DTYPE)
            records["prefix"] = hash_prefixes(part.column("text_sha256"))
            records["chunk"] = index
            records["position"] = np.arange(part.num_rows)
            spill.add(records, bucket_of(records["prefix"]))
    spill.flush()
