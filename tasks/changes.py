"""Change sets: what a committed run added, changed and removed relative to the run before it.

``changes/{run_key}.parquet`` (DESIGN §4, a contract) has columns ``id`` (string), ``change``
(string: ``added``, ``changed`` or ``removed``), ``text_sha256`` (string: the new text's
hash for added/changed ids, the old one for removed ids) and ``text_changed`` (bool: True
when the text changed, False when only kept columns did, null for added and removed),
sorted by id. Unchanged ids are only counted. An id whose text is the same but whose kept
values differ is ``changed`` (its vector is reused, not sent again: DESIGN §8). The base
is ``latest_manifest`` over the same output root and dataset (columns, template, kept
columns, model, dimensions) at the moment of committing (named in the manifest as
``changes.base_run_key``), so a consumer that applied exactly that run can apply this one.

Only ids with a vector count: an id that became a dead letter is ``removed``. Memory stays
flat-ish: chunk objects both runs list are skipped (same content key, same rows), and of the
others only the ``id`` and ``text_sha256`` columns are read (ranged reads on S3), about
100 bytes per row that differs.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from adapters.sinks.base import KEPT_HASH, kept_hashes
from embedline.errors import ConflictError
from embedline.protocols import ObjectStore

__all__ = ["CHANGES_FORMAT", "ChangeCounts", "changes_object_key", "read_keys", "write_changes"]

CHANGES_FORMAT = "embedline.changes.v1"
_META_KEY = b"embedline"
_KEY_COLUMNS = ["id", "text_sha256"]
_CHANGE_COLUMNS = ["id", "change", "text_sha256", "text_changed"]


def changes_object_key(run_key: str) -> str:
    """Return the change set's object key, ``changes/{run_key}.parquet``."""
    return f"changes/{run_key}.parquet"


@dataclass(frozen=True, slots=True)
class ChangeCounts:
    """Counts of ids (rows with a vector) by change, and what the change set was taken from.

    ``base_run_key`` is None for the first committed run (every id is ``added``).
    """

    object: str
    sha256: str
    base_run_key: str | None
    added: int
    changed: int
    removed: int
    unchanged: int

    def to_dict(self) -> dict[str, object]:
        """Return the counts as the manifest's ``changes`` entry."""
        return asdict(self)


def read_keys(store: ObjectStore, object_key: str, kept_columns: Sequence[str] = ()) -> pa.Table:
    """Return the ``id`` and ``text_sha256`` columns of a chunk object (strings), and with
    ``kept_columns`` also ``kept_sha256`` (``adapters.sinks.base.kept_hashes``).

    Reads only those columns' pages (and the footer), never the vectors.

    :raises FileNotFoundError: the object does not exist.
    """
    with store.open_read(object_key) as fh:
        parquet = pq.ParquetFile(fh)
        if not kept_columns:
            return parquet.read(columns=_KEY_COLUMNS)
        present = [c for c in kept_columns if c in parquet.schema_arrow.names]
        table = parquet.read(columns=_KEY_COLUMNS + present)
    return table.select(_KEY_COLUMNS).append_column(KEPT_HASH, kept_hashes(table, kept_columns))


def _empty(columns: Sequence[str]) -> pa.Table:
    """A 0-row table of string columns. Not ``Schema.empty_table()`` nor ``pq.read_table``:
    both make pyarrow import pandas (0.14 s), most of what committing a re-export without
    Prefect cost beyond an unchanged rerun."""
    return pa.Table.from_batches([], schema=pa.schema([(c, pa.string()) for c in columns]))


def _empty_changes() -> pa.Table:
    schema = pa.schema([(c, pa.bool_() if c == "text_changed" else pa.string())
                        for c in _CHANGE_COLUMNS])
    return pa.Table.from_batches([], schema=schema)


def _keys_of(store: ObjectStore, chunks: Iterable[dict[str, Any]],
             kept_columns: Sequence[str]) -> pa.Table:
    tables = [read_keys(store, str(c["object"]), kept_columns) for c in chunks if int(c["rows"])]
    if not tables:
        return _empty(_KEY_COLUMNS + ([KEPT_HASH] if kept_columns else []))
    return pa.concat_tables(tables)


def diff(
    store: ObjectStore, current: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]],
    kept_columns: Sequence[str] = (),
) -> pa.Table:
    """Return the change rows (``id``, ``change``, ``text_sha256``, ``text_changed``) sorted
    by id; with ``kept_columns`` an id whose kept values differ is ``changed`` too.

    ``current`` and ``base`` are manifest ``chunks`` entries (``object``, ``rows``). Ids are
    unique within each run (the planner refuses duplicates), so a chunk object both runs
    list holds the same ids with the same texts (and kept values: they are in its key) on
    both sides and is never read.
    """
    shared = {str(c["object"]) for c in current} & {str(c["object"]) for c in base}
    new = _keys_of(store, [c for c in current if str(c["object"]) not in shared], kept_columns)
    old = _keys_of(store, [c for c in base if str(c["object"]) not in shared], kept_columns)
    if new.num_rows == 0 and old.num_rows == 0:  # e.g. a re-export: every chunk shared
        return _empty_changes()
    old = old.rename_columns([c if c == "id" else c + "_old" for c in old.column_names])
    joined = new.join(old, keys="id", join_type="full outer", coalesce_keys=True)
    now, before = joined["text_sha256"], joined["text_sha256_old"]
    text_differs = pc.not_equal(now, before)
    differs = text_differs
    if kept_columns:
        differs = pc.or_(text_differs, pc.not_equal(joined[KEPT_HASH], joined[KEPT_HASH + "_old"]))
    change = pc.case_when(
        pc.make_struct(pc.is_null(before), pc.is_null(now), differs),
        "added", "removed", "changed", pa.scalar(None, pa.string()),
    )
    table = pa.Table.from_arrays([joined["id"], change, pc.coalesce(now, before), text_differs],
                                 names=_CHANGE_COLUMNS)
    return table.filter(pc.is_valid(table["change"])).sort_by("id")


def _parquet(run_key: str, base_run_key: str | None, table: pa.Table) -> bytes:
    meta = {"format": CHANGES_FORMAT, "run_key": run_key, "base_run_key": base_run_key}
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta, sort_keys=True).encode()})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _counts_of(object_key: str, body: bytes, *, rows: int) -> ChangeCounts:
    """Counts from the object itself; ``rows`` = ids with a vector in this run, so
    unchanged = rows - added - changed."""
    column = pq.ParquetFile(io.BytesIO(body)).read(columns=["change"])["change"]
    counts = {str(v["values"]): int(v["counts"]) for v in column.value_counts().to_pylist()}
    added, changed = counts.get("added", 0), counts.get("changed", 0)
    return ChangeCounts(
        object=object_key, sha256=hashlib.sha256(body).hexdigest(),
        base_run_key=_meta(body)["base_run_key"], added=added, changed=changed,
        removed=counts.get("removed", 0), unchanged=rows - added - changed,
    )


def write_changes(
    store: ObjectStore,
    *,
    run_key: str,
    chunks: Sequence[dict[str, Any]],
    base: dict[str, Any] | None,
    kept_columns: Sequence[str] = (),
) -> ChangeCounts:
    """Compute this run's change set against ``base`` (a manifest, or None) and create it
    (``kept_columns``: see ``diff``).

    Idempotent: if ``changes/{run_key}.parquet`` already exists (an earlier attempt of this
    run died before its manifest), that object is kept, with the base it names, since it is
    still a true change set relative to that base; nothing is overwritten.

    :raises ConflictError: the key holds an object that is not this run's change set.
    """
    key = changes_object_key(run_key)
    table = diff(store, chunks, list(base["chunks"]) if base else [], kept_columns)
    body = _parquet(run_key, str(base["run_key"]) if base else None, table)
    try:
        store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(),
                            content_type="application/vnd.apache.parquet")
    except ConflictError:
        body = store.get(key)
        if _meta(body).get("run_key") != run_key:
            raise
    return _counts_of(key, body, rows=sum(int(c["rows"]) for c in chunks))


def _meta(body: bytes) -> dict[str, Any]:
    try:
        return dict(json.loads((pq.read_schema(io.BytesIO(body)).metadata or {})[_META_KEY]))
    except (pa.ArrowInvalid, KeyError, json.JSONDecodeError):
        return {}
