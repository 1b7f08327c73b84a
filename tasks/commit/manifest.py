"""The run manifest: written once, last, by conditional create. It is the commit point.

Format ``embedline.manifest.v2`` (docs/reference/output-layout.md, a contract), a superset of v1
(still read everywhere): ``rows_published + rows_failed == input.rows``; ``chunks[].rows`` counts
rows in each object; ``chunks[].sha256`` is of the object's bytes; ``dimensions`` is the vectors'
actual length; ``changes`` names the run's change set (``tasks/commit/changes.py``) and its counts;
``created_at`` is UTC with microseconds (v1: seconds).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from embedline.errors import ConflictError
from embedline.models import InputPlan, ManifestChunk, manifest_object_key
from embedline.protocols import ObjectStore
from embedline.template import TEXT_COLUMN, placeholder

__all__ = [
    "DATASET_FIELDS",
    "MANIFEST_FORMAT",
    "MANIFEST_FORMATS",
    "already_complete_fields",
    "build_manifest",
    "change_fields",
    "created_at",
    "dataset_key",
    "extra_columns",
    "latest_manifest",
    "list_manifests",
    "live_rows",
    "read_manifest",
    "write_manifest",
]

MANIFEST_FORMAT = "embedline.manifest.v2"
#: Formats every reader accepts (v1 manifests written before change sets stay valid).
MANIFEST_FORMATS = ("embedline.manifest.v1", MANIFEST_FORMAT)


def build_manifest(
    *,
    run_key: str,
    plan: InputPlan,
    embedder: str,
    model: str,
    dimensions: int,
    chunks: Sequence[ManifestChunk],
    rows_failed: int,
    changes: dict[str, object] | None = None,
    dead_letters: dict[str, int] | None = None,
    request_settings: str | None = None,
    generation: int = 0,
    supersedes: str | None = None,
) -> dict[str, object]:
    """Return the manifest as a JSON-ready dict (chunks in index order).

    ``changes`` is ``ChangeCounts.to_dict()`` (object key, sha256, base run key, counts).
    ``dead_letters`` counts the run's dead letters by reason; ``request_settings`` is
    ``RunSettings.request_fingerprint``; ``generation``/``supersedes`` name the committed
    run whose dead letters this one retried (docs/reference/output-layout.md, "Generations"; 0/None
    for a first commit).

    :raises ValueError: the counts do not add up to the input's rows.
    """
    rows_published = sum(c.rows for c in chunks)
    if rows_published + rows_failed != plan.rows:
        raise ValueError(
            f"manifest counts do not add up: {rows_published} published + {rows_failed} "
            f"failed != {plan.rows} input rows"
        )
    return {
        "format": MANIFEST_FORMAT,
        "run_key": run_key,
        "input": {
            "name": plan.source.name,
            "sha256": plan.sha256,
            "bytes": plan.bytes,
            "rows": plan.rows,
        },
        "id_column": plan.source.id_column,
        "text_column": plan.source.text_column,
        "text_template": plan.source.text_template or placeholder(plan.source.text_column),
        "kept_columns": list(plan.source.kept_columns),
        "keep_text": plan.source.keep_text,
        "embedder": embedder,
        "model": model,
        "dimensions": dimensions,
        "rows_published": rows_published,
        "rows_failed": rows_failed,
        "chunks": [c.to_dict() for c in sorted(chunks, key=lambda c: c.index)],
        "changes": changes,
        "dead_letters": dict(sorted((dead_letters or {}).items())),
        "request_settings": request_settings,
        "generation": generation,
        "supersedes": supersedes,
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }


def live_rows(table: pa.Table, entry: dict[str, Any], *, uri: str) -> pa.Table:
    """The rows of one chunk object (``table``, read whole) that the manifest entry ``entry``
    takes: all of them, or all but those whose ``id`` is in ``drop_ids``
    (docs/reference/output-layout.md, "Delta nights"). ``table`` needs its ``id`` column.

    :raises ConflictError: the object does not hold ``rows`` plus the dropped rows (``uri``
        names it), or a dropped id is not in it: the object is not the one committed.
    """
    drops = entry.get("drop_ids") or []
    expected = int(entry["rows"]) + len(drops)
    if table.num_rows != expected:
        raise ConflictError(
            f"{uri} holds {table.num_rows} rows, its manifest says {expected}"
            + (f" ({entry['rows']} taken, {len(drops)} dropped)" if drops else "")
        )
    if not drops:
        return table
    keep = pc.invert(pc.is_in(table.column("id"), value_set=pa.array(drops, pa.string())))
    kept = table.filter(keep)
    if kept.num_rows != int(entry["rows"]):
        raise ConflictError(f"{uri}: ids its manifest drops are not all in it")
    return kept


def write_manifest(store: ObjectStore, manifest: dict[str, object]) -> tuple[str, bool]:
    """Create ``manifests/{run_key}.json``; return ``(uri, created)``.

    ``created`` is False when a manifest for this run key already existed (a concurrent run
    committed first): that manifest stands, ours is dropped, nothing is overwritten.

    :raises ConflictError: the existing object is not a manifest of this run key.
    """
    key = manifest_object_key(str(manifest["run_key"]))
    body = (json.dumps(manifest, indent=2) + "\n").encode()
    digest = hashlib.sha256(body).hexdigest()
    try:
        put = store.put_if_absent(key, body, sha256=digest, content_type="application/json")
        return store.uri_for(key), put.created
    except ConflictError:
        existing = read_manifest(store, str(manifest["run_key"]))
        if existing is None or existing.get("run_key") != manifest["run_key"]:
            raise
        return store.uri_for(key), False


def read_manifest(store: ObjectStore, run_key: str) -> dict[str, object] | None:
    """Return the run's committed manifest, or None when the run has none yet.

    :raises ConflictError: the object exists but is not a manifest.
    """
    key = manifest_object_key(run_key)
    try:
        body = store.get(key)
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(body)
    except json.JSONDecodeError:
        raise ConflictError(f"{store.uri_for(key)} exists but is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in MANIFEST_FORMATS:
        raise ConflictError(f"{store.uri_for(key)} exists but is not an embedline manifest")
    return manifest


def list_manifests(store: ObjectStore) -> Iterator[dict[str, Any]]:
    """Yield every committed manifest under the store (v1 and v2), in no particular order.

    Objects under ``manifests/`` that are not manifests are skipped.
    """
    for info in store.list("manifests/"):
        name = info.key.rsplit("/", 1)[-1]
        if not name.endswith(".json"):
            continue
        try:
            manifest = read_manifest(store, name[: -len(".json")])
        except ConflictError:
            continue
        if manifest is not None:
            yield manifest


def created_at(manifest: dict[str, Any]) -> datetime:
    """A manifest's commit time (UTC), from v1 (seconds) or v2 (microseconds) text."""
    return datetime.fromisoformat(str(manifest["created_at"]).replace("Z", "+00:00"))


#: What makes runs one dataset (docs/reference/output-layout.md, "Change sets",
#: "Retention"): the input
#: columns read, how the text is built and what is kept, the model and the vector length.
#: Fields a manifest does not record (older formats) count as None.
DATASET_FIELDS = (
    "id_column",
    "text_column",
    "text_template",
    "keep_columns",
    "kept_columns",
    "model",
    "dimensions",
)


def dataset_key(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's dataset, ``{field: value}`` for ``DATASET_FIELDS`` in that order
    (lists become tuples so the values hash); names and settings only, never input text.

    A plain run's template (``{text_column}``) and an empty list of kept columns read as
    None, as in manifests without those fields, so plain runs are one dataset whether their
    manifests have the fields or not."""
    values = {f: manifest.get(f) for f in DATASET_FIELDS}
    if values["text_column"] is not None and values["text_template"] == placeholder(
        str(values["text_column"])
    ):
        values["text_template"] = None
    values["kept_columns"] = values["kept_columns"] or values["keep_columns"] or None
    values["keep_columns"] = None
    return {f: tuple(v) if isinstance(v, list) else v for f, v in values.items()}


def extra_columns(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The columns the run's chunk objects hold after embedline's own
    (docs/reference/output-layout.md): its kept columns, then ``text`` when it kept the text (none
    for older manifests)."""
    kept = tuple(str(c) for c in manifest.get("kept_columns") or ())
    return kept + ((TEXT_COLUMN,) if manifest.get("keep_text") else ())


def latest_manifest(
    store: ObjectStore,
    *,
    id_column: str | None = None,
    text_column: str | None = None,
    model: str | None = None,
    dimensions: int | None = None,
    exclude_run_key: str | None = None,
    dataset: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Return the latest committed manifest, by ``created_at`` then run key, among those
    matching every criterion given (None matches anything); None if there is none.
    ``dataset`` (a ``dataset_key``) matches only manifests of that dataset.

    This is "the previous committed run" of a change set (docs/reference/output-layout.md) and the
    default run of readers. Lists ``manifests/`` and reads each (small JSON objects).
    """
    wanted = {
        "id_column": id_column,
        "text_column": text_column,
        "model": model,
        "dimensions": dimensions,
    }
    best: dict[str, Any] | None = None
    for manifest in list_manifests(store):
        if manifest["run_key"] == exclude_run_key:
            continue
        if any(v is not None and manifest.get(k) != v for k, v in wanted.items()):
            continue
        if dataset is not None and dataset_key(manifest) != dataset:
            continue
        if best is None or (created_at(manifest), manifest["run_key"]) > (
            created_at(best),
            best["run_key"],
        ):
            best = manifest
    return best


def already_complete_fields(manifest: dict[str, Any]) -> dict[str, Any]:
    """The ``RunSummary`` fields of a run found already committed (status
    ``already_complete``, exit 0): its counts from ``manifest``; nothing embedded or written."""
    return dict(
        exit_code=0,
        status="already_complete",
        message="the run's manifest already exists: nothing to do",
        rows_total=int(manifest["input"]["rows"]),
        rows_published=int(manifest["rows_published"]),
        rows_skipped=int(manifest["rows_published"]),
        rows_failed=int(manifest["rows_failed"]),
        # the objects the run takes, counted alike (a delta run's planned chunks are not)
        chunks_total=len(manifest["chunks"]),
        chunks_skipped=len(manifest["chunks"]),
        dimensions=int(manifest["dimensions"]),
        **change_fields(manifest),
    )


def change_fields(manifest: dict[str, Any]) -> dict[str, Any]:
    """The ``RunSummary`` change-set fields of a manifest (none for a v1 manifest)."""
    changes = manifest.get("changes")
    if not changes:
        return {}
    return {
        "rows_added": int(changes["added"]),
        "rows_changed": int(changes["changed"]),
        "rows_removed": int(changes["removed"]),
        "rows_unchanged": int(changes["unchanged"]),
        "changes_object": str(changes["object"]),
        "changes_base": changes.get("base_run_key"),
    }
