"""Change sets: what a committed run added, changed and removed relative to the run before it.

``changes/{run_key}.parquet`` (DESIGN §4, a contract) has columns ``id`` (string), ``change``
(string: ``added``, ``changed`` or ``removed``) and ``text_sha256`` (string: the new text's
hash for added/changed ids, the old one for removed ids), sorted by id. Unchanged ids are
only counted. The base is ``latest_manifest`` over the same output root, id column, text
column, model and dimensions at the moment of committing (named in the manifest as
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

from embedline.errors import ConflictError
from embedline.protocols import ObjectStore

__all__ = ["CHANGES_FORMAT", "ChangeCounts", "changes_object_key", "read_keys", "write_changes"]

CHANGES_FORMAT = "embedline.changes.v1"
_META_KEY = b"embedline"
_KEY_COLUMNS = ["id", "text_sha256"]
_CHANGE_COLUMNS = ["id", "change", "text_sha256"]


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


def read_keys(store: ObjectStore, object_key: str) -> pa.Table:
    """Return the ``id`` and ``text_sha256`` columns of a chunk object (strings).

    Reads only those columns' pages (and the footer), never the vectors.

    :raises FileNotFoundError: the object does not exist.
    """
    with store.open_read(object_key) as fh:
        return pq.ParquetFile(fh).read(columns=_KEY_COLUMNS)


def _empty(columns: Sequence[str]) -> pa.Table:
    """A 0-row table of string columns. Not ``Schema.empty_table()`` nor ``pq.read_table``:
    both make pyarrow import pandas (0.14 s), most of what committing a re-export without
    Prefect cost beyond an unchanged rerun."""
    return pa.Table.from_batches([], schema=pa.schema([(c, pa.string()) for c in columns]))


def _keys_of(store: ObjectStore, chunks: Iterable[dict[str, Any]]) -> pa.Table:
    tables = [read_keys(store, str(c["object"])) for c in chunks if int(c["rows"])]
    if not tables:
        return _empty(_KEY_COLUMNS)
    return pa.concat_tables(tables)


def diff(
    store: ObjectStore, current: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]]
) -> pa.Table:
    """Return the change rows (``id``, ``change``, ``text_sha256``) sorted by id.

    ``current`` and ``base`` are manifest ``chunks`` entries (``object``, ``rows``). Ids are
    unique within each run (the planner refuses duplicates), so a chunk object both runs
    list holds the same ids with the same texts on both sides and is never read.
    """
    shared = {str(c["object"]) for c in current} & {str(c["object"]) for c in base}
    new = _keys_of(store, [c for c in current if str(c["object"]) not in shared])
    old = _keys_of(store, [c for c in base if str(c["object"]) not in shared])
    if new.num_rows == 0 and old.num_rows == 0:  # e.g. a re-export: every chunk shared
        return _empty(_CHANGE_COLUMNS)
    joined = new.join(old, keys="id", join_type="full outer", left_suffix="",
                      right_suffix="_old", coalesce_keys=True)  # fmt: skip
    if "text_sha256_old" not in joined.column_names:  # pyarrow drops suffixes with no clash
        joined = joined.rename_columns(["id", "text_sha256", "text_sha256_old"])
    now, before = joined["text_sha256"], joined["text_sha256_old"]
    change = pc.case_when(
        pc.make_struct(pc.is_null(before), pc.is_null(now),
                       pc.not_equal(now, before)),  # fmt: skip
        "added", "removed", "changed", pa.scalar(None, pa.string()),
    )
    table = pa.Table.from_arrays([joined["id"], change, pc.coalesce(now, before)],
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
    )  # fmt: skip


def write_changes(
    store: ObjectStore,
    *,
    run_key: str,
    chunks: Sequence[dict[str, Any]],
    base: dict[str, Any] | None,
) -> ChangeCounts:
    """Compute this run's change set against ``base`` (a manifest, or None) and create it.

    Idempotent: if ``changes/{run_key}.parquet`` already exists (an earlier attempt of this
    run died before its manifest), that object is kept, with the base it names, since it is
    still a true change set relative to that base; nothing is overwritten.

    :raises ConflictError: the key holds an object that is not this run's change set.
    """
    key = changes_object_key(run_key)
    table = diff(store, chunks, list(base["chunks"]) if base else [])
    body = _parquet(run_key, str(base["run_key"]) if base else None, table)
    try:
        store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(),
                            content_type="application/vnd.apache.parquet")  # fmt: skip
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
