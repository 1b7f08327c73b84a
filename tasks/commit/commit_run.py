"""Commit a run: its change set, then its manifest (the commit point). No Prefect here.

Called by ``flows.run.Run.conclude``, which the ``embed-csv`` flow and ``embedline run``'s
path without Prefect (every chunk already published) share.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from adapters.disk_full import translate_full
from adapters.ledger import Ledger
from embedline.delete_share import check_delete_share
from embedline.errors import BadResponseError
from embedline.models import ChunkOutcome, InputPlan, ManifestChunk
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from tasks.commit.changes import ChangeCounts, write_change_table, write_changes
from tasks.commit.manifest import (
    build_manifest,
    dataset_key,
    latest_manifest,
    read_manifest,
    write_manifest,
)
from tasks.plan.delta import CHANGES_FILE
from tasks.publish.dimensions import checked_dimensions

__all__ = ["CommitResult", "commit_run", "ledger_catches_up", "missing_objects", "run_fingerprint"]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """A committed run: the manifest's URI and content (the winner's, if a concurrent run
    of the same key committed first: ``created`` False), its change set, the dimensions."""

    uri: str
    created: bool
    manifest: dict[str, Any]
    changes: ChangeCounts
    dimensions: int


#: Chunk objects from which ``missing_objects`` lists ``chunks/`` instead of a HEAD each.
_LIST_FROM = 64


def missing_objects(store: ObjectStore, done: dict[int, ChunkOutcome]) -> list[str]:
    """Chunk objects a manifest would list that are no longer in the store: a HEAD each
    for a few, else one listing of ``chunks/`` (a thousand keys per S3 request, and a
    local store's HEAD reads and hashes the whole file: 200 HEADs read 260 MB)."""
    keys = sorted({o.object_key for o in done.values()})
    if len(keys) >= _LIST_FROM:
        listed = {info.key for info in store.list("chunks/")}
        return [k for k in keys if k not in listed]
    with ThreadPoolExecutor(16) as pool:
        present = list(pool.map(lambda k: store.head_sha256(k) is not None, keys))
    return [k for k, here in zip(keys, present, strict=True) if not here]


def _dimensions(settings: RunSettings, store: ObjectStore, done: dict[int, ChunkOutcome]) -> int:
    """The vectors' length, the one every non-empty chunk object has (their footers), else
    the setting. :raises BadResponseError: the objects disagree (``checked_dimensions``)."""
    return checked_dimensions(store, done, settings.dimensions) or settings.dimensions or 0


def _scratch_parent(settings: RunSettings) -> Path:
    """Where the change set is sorted and written before its upload when the plan has no
    scratch directory (``adapters.scratch``, which a dead process's leftovers are swept
    from): beside the ledger (a disk the run already writes to), never /tmp, which may be
    small (about 80 bytes a row of each side that differs, plus the change set; deleted
    when the commit returns)."""
    parent = Path(settings.ledger).absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def run_fingerprint(outcomes: Iterable[ChunkOutcome]) -> str | None:
    """The run's ``tasks.publish.chunk_object.rows_fingerprint``: the XOR of its chunks' (from their
    objects' metadata, ``with_lengths``); None if a chunk object's metadata has none or the
    outcomes were not read."""
    folded = 0
    for outcome in outcomes:
        if outcome.rows and outcome.rows_xor is None:
            return None
        folded ^= int(outcome.rows_xor or "0", 16)
    return f"{folded:016x}"


def commit_run(
    store: ObjectStore,
    *,
    settings: RunSettings,
    plan: InputPlan,
    run_key: str,
    done: dict[int, ChunkOutcome],
    rows_failed: int,
    generation: int = 0,
    supersedes: str | None = None,
) -> CommitResult:
    """Write the change set against the latest committed run of the same dataset
    (``tasks.commit.manifest.dataset_key``: columns, template, kept columns, model, dimensions;
    docs/reference/output-layout.md), then the manifest
    (of ``generation``, superseding the committed run ``supersedes``:
    docs/reference/output-layout.md, "Generations").

    :raises ConflictError: the change-set or manifest key holds something else.
    :raises MassDeleteError: the change set removes more than ``max_delete_fraction`` of the
        base run's rows (nothing committed; the change set object, create-only, stays).
    :raises ValueError: the counts do not add up to the input's rows.
    :raises BadResponseError: chunk objects of different lengths (nothing written).
    :raises DiskFullError: the filesystem beside the ledger (the change set's scratch
        space) is full.
    """
    if plan.delta is not None:
        return _commit_delta(
            store,
            settings=settings,
            plan=plan,
            run_key=run_key,
            done=done,
            rows_failed=rows_failed,
            generation=generation,
            supersedes=supersedes,
        )
    dims = _dimensions(settings, store, done)
    chunks = [
        ManifestChunk(o.index, o.key, o.object_key, o.rows, o.object_sha256)
        for o in sorted(done.values(), key=lambda o: o.index)
    ]
    manifest = build_manifest(
        run_key=run_key,
        plan=plan,
        embedder=settings.embedder,
        model=settings.effective_model,
        dimensions=dims,
        chunks=chunks,
        rows_failed=rows_failed,
        changes=None,
        dead_letters=Counter(d.reason for o in done.values() for d in o.dead_letters),
        request_settings=settings.request_fingerprint,
        generation=generation,
        supersedes=supersedes,
    )
    fingerprint = run_fingerprint(done.values())
    if fingerprint is not None:
        manifest["rows_xor"] = fingerprint
    base = latest_manifest(
        store, dimensions=dims, exclude_run_key=run_key, dataset=dataset_key(manifest)
    )
    same = (
        base is not None
        and fingerprint is not None
        and not settings.kept_columns
        and base.get("rows_xor") == fingerprint
        and base.get("rows_published") == manifest["rows_published"]
    )
    with (
        tempfile.TemporaryDirectory(
            dir=plan.scratch or _scratch_parent(settings), prefix="commit-"
        ) as scratch,
        translate_full(scratch, "change set's scratch directory"),
    ):
        changes = write_changes(
            store,
            run_key=run_key,
            chunks=[c.to_dict() for c in chunks],
            base=base,
            kept_columns=settings.kept_columns,
            scratch_dir=Path(scratch),
            same_rows=same,
        )
    if base is not None and changes.base_run_key == str(base["run_key"]):
        check_delete_share(
            changes.removed,
            sum(int(c["rows"]) for c in base["chunks"]),
            settings.max_delete_fraction,
            kept="nothing committed, every chunk is kept",
            what=f"run {run_key[:12]}'s change set against run {str(base['run_key'])[:12]}",
        )
    manifest["changes"] = changes.to_dict()
    uri, created = write_manifest(store, manifest)
    if not created:
        manifest = read_manifest(store, run_key) or manifest
    return CommitResult(uri, created, manifest, changes, dims)


def _commit_delta(
    store: ObjectStore,
    *,
    settings: RunSettings,
    plan: InputPlan,
    run_key: str,
    done: dict[int, ChunkOutcome],
    rows_failed: int,
    generation: int = 0,
    supersedes: str | None = None,
) -> CommitResult:
    """``commit_run`` of a delta night (``plan.delta``, docs/design.md, "Delta nights"):
    the manifest lists the night's chunk objects, then the base's entries it inherits
    (indexes after the night's, ``drop_ids`` updated); its change set was computed when
    the night was planned. Raises as ``commit_run``."""
    delta = plan.delta
    assert delta is not None and plan.scratch is not None
    dims = _dimensions(settings, store, done) if done else delta.dimensions
    if dims != delta.dimensions and any(o.rows for o in done.values()):
        raise BadResponseError(
            f"the night's vectors are {dims} long, run {delta.base_run_key[:12]}'s "
            f"{delta.dimensions}: rerun with --compact to embed every row again"
        )
    night = [
        ManifestChunk(o.index, o.key, o.object_key, o.rows, o.object_sha256)
        for o in sorted(done.values(), key=lambda o: o.index)
    ]
    inherited = [
        replace(ManifestChunk.from_dict(dict(e)), index=len(plan.chunks) + i)
        for i, e in enumerate(delta.inherited)
    ]
    dead = Counter(d.reason for o in done.values() for d in o.dead_letters)
    if delta.rows_empty:
        dead["empty_text"] += delta.rows_empty
    manifest = build_manifest(
        run_key=run_key,
        plan=plan,
        embedder=settings.embedder,
        model=settings.effective_model,
        dimensions=delta.dimensions,
        chunks=night + inherited,
        rows_failed=rows_failed,
        dead_letters=dead,
        request_settings=settings.request_fingerprint,
        generation=generation,
        supersedes=supersedes,
    )
    check_delete_share(
        delta.removed,
        delta.base_rows,
        settings.max_delete_fraction,
        kept="nothing committed, every chunk is kept",
        what=f"run {run_key[:12]}'s change set against run {delta.base_run_key[:12]}",
    )
    with translate_full(plan.scratch, "change set's scratch directory"):
        changes = write_change_table(
            store,
            run_key=run_key,
            base_run_key=delta.base_run_key,
            table=pq.read_table(Path(plan.scratch) / CHANGES_FILE),
            rows=int(manifest["rows_published"]),  # type: ignore[call-overload]
            scratch_dir=Path(plan.scratch),
        )
    manifest["changes"] = changes.to_dict()
    uri, created = write_manifest(store, manifest)
    if not created:
        manifest = read_manifest(store, run_key) or manifest
    return CommitResult(uri, created, manifest, changes, delta.dimensions)


def ledger_catches_up(
    ledger_path: str | os.PathLike[str], manifest: dict[str, Any], uri: str
) -> bool:
    """Record in the ledger at ``ledger_path`` that the run of ``manifest`` (found in the
    store at ``uri``) is ``complete``, with its counts, if the ledger says otherwise.

    The manifest's PUT is the commit point (docs/reference/output-layout.md) and the ledger's write
    comes after it: a process killed, or stopped by a second signal, between the two left the run
    ``running`` or ``interrupted`` and its dead letters uncounted, so ``status`` and
    ``load`` (which loads the ledger's last complete run) disagreed with the store. A rerun
    that finds the manifest calls this. Returns True if the ledger changed; a missing or
    unreadable ledger is left alone (it is a cache of the store here: nothing is lost).
    """
    if not os.path.exists(ledger_path):
        return False
    try:
        ledger = Ledger(ledger_path)
        try:
            return ledger.record_committed(
                str(manifest["run_key"]),
                manifest_uri=uri,
                rows_published=int(manifest["rows_published"]),
                rows_failed=int(manifest["rows_failed"]),
            )
        finally:
            ledger.close()
    except (OSError, sqlite3.Error):
        return False
