"""Commit a run: its change set, then its manifest (the commit point). No Prefect here.

Used by the ``embed-csv`` flow after its chunks are published, and by ``embedline run``
directly when every chunk of the input is already published (a re-export with the same
rows: nothing to embed, so no reason to start Prefect).
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from adapters.ledger import Ledger
from embedline import shutdown
from embedline.models import (
    ChunkOutcome,
    InputPlan,
    ManifestChunk,
    RunSummary,
    blocking_dead_letters,
    committed_dead_letters_note,
    dead_letters_block_message,
)
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from tasks.changes import ChangeCounts, write_changes
from tasks.dimensions import checked_dimensions, other_lengths, run_length, with_lengths
from tasks.manifest import (
    build_manifest,
    change_fields,
    latest_manifest,
    read_manifest,
    write_manifest,
)
from tasks.publish import ensure_conditional_writes
from tasks.published import find_published, retries_dead_letters
from tasks.sink_state import MassDeleteError, check_delete_share

__all__ = ["Committed", "commit_if_published", "commit_run", "delete_refused", "ledger_catches_up",
           "missing_objects"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed run: the manifest's URI and content (the winner's, if a concurrent run
    of the same key committed first: ``created`` False), its change set, the dimensions."""

    uri: str
    created: bool
    manifest: dict[str, Any]
    changes: ChangeCounts
    dimensions: int


def missing_objects(store: ObjectStore, done: dict[int, ChunkOutcome]) -> list[str]:
    """Chunk objects a manifest would list that are no longer in the store (HEAD each)."""
    keys = sorted({o.object_key for o in done.values()})
    with ThreadPoolExecutor(16) as pool:
        present = list(pool.map(lambda k: store.head_sha256(k) is not None, keys))
    return [k for k, here in zip(keys, present, strict=True) if not here]


def _dimensions(settings: RunSettings, store: ObjectStore, done: dict[int, ChunkOutcome]) -> int:
    """The vectors' length, the one every non-empty chunk object has (their footers), else
    the setting. :raises BadResponseError: the objects disagree (``checked_dimensions``)."""
    return checked_dimensions(store, done, settings.dimensions) or settings.dimensions or 0


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
) -> Committed:
    """Write the change set against the latest committed run (DESIGN §4), then the manifest
    (of ``generation``, superseding the committed run ``supersedes``: DESIGN §8).

    :raises ConflictError: the change-set or manifest key holds something else.
    :raises MassDeleteError: the change set removes more than ``max_delete_fraction`` of the
        base run's rows (nothing committed; the change set object, create-only, stays).
    :raises ValueError: the counts do not add up to the input's rows.
    :raises BadResponseError: chunk objects of different lengths (nothing written).
    """
    dims = _dimensions(settings, store, done)
    chunks = [ManifestChunk(o.index, o.key, o.object_key, o.rows, o.object_sha256)
              for o in sorted(done.values(), key=lambda o: o.index)]  # fmt: skip
    base = latest_manifest(store, id_column=settings.id_column,
                           text_column=settings.text_column, model=settings.effective_model,
                           dimensions=dims, exclude_run_key=run_key)  # fmt: skip
    changes = write_changes(store, run_key=run_key, chunks=[c.to_dict() for c in chunks],
                            base=base)  # fmt: skip
    if base is not None and changes.base_run_key == str(base["run_key"]):
        check_delete_share(
            changes.removed, sum(int(c["rows"]) for c in base["chunks"]),
            settings.max_delete_fraction, kept="nothing committed, every chunk is kept",
            what=f"run {run_key[:12]}'s change set against run {str(base['run_key'])[:12]}",
        )  # fmt: skip
    manifest = build_manifest(
        run_key=run_key, plan=plan, embedder=settings.embedder,
        model=settings.effective_model, dimensions=dims, chunks=chunks,
        rows_failed=rows_failed, changes=changes.to_dict(),
        dead_letters=Counter(d.reason for o in done.values() for d in o.dead_letters),
        request_settings=settings.request_fingerprint, generation=generation,
        supersedes=supersedes,
    )  # fmt: skip
    uri, created = write_manifest(store, manifest)
    if not created:
        manifest = read_manifest(store, run_key) or manifest
    return Committed(uri, created, manifest, changes, dims)


def _blocked_by_dead_letters(
    ledger: Ledger, store: ObjectStore, settings: RunSettings, plan: InputPlan, run_key: str,
    done: dict[int, ChunkOutcome], rows_failed: int, blocking: int, *, wall_s: float,
    generation: int, supersedes: str | None,
) -> RunSummary:  # fmt: skip
    """Record and return the end of a run whose chunks are all published but whose dead
    letters (``blocking`` of its ``rows_failed``) keep it from committing (the flow's
    ``dead_letters`` summary, exit 1)."""
    rows = sum(o.rows for o in done.values())
    ledger.finish_run(run_key, status="dead_letters", rows_published=rows,
                      rows_failed=rows_failed, manifest_uri=None)  # fmt: skip
    return RunSummary(
        exit_code=1, status="dead_letters",
        message=dead_letters_block_message(blocking, run_key),
        run_key=run_key, output=store.uri, rows_total=plan.rows,
        rows_published=rows, rows_skipped=rows, rows_failed=rows_failed,
        chunks_total=len(plan.chunks), chunks_skipped=len(done), wall_s=round(wall_s, 3),
        price_per_million_tokens=settings.price_per_million_tokens,
        generation=generation, supersedes=supersedes,
    )  # fmt: skip


def delete_refused(ledger: Ledger, store: ObjectStore, plan: InputPlan, run_key: str,
                   done: dict[int, ChunkOutcome], rows_failed: int, exc: MassDeleteError, *,
                   wall_s: float) -> RunSummary:  # fmt: skip
    """Record and return a run whose chunks are all published but whose change set removes
    too much to commit (status ``delete_refused``, exit 2): a rerun with a higher
    ``--max-delete-fraction`` commits it without embedding."""
    rows = sum(o.rows for o in done.values())
    ledger.finish_run(run_key, status="delete_refused", rows_published=rows,
                      rows_failed=rows_failed, manifest_uri=None)  # fmt: skip
    return RunSummary(
        exit_code=exc.exit_code, status="delete_refused", message=str(exc), run_key=run_key,
        output=store.uri, rows_total=plan.rows, rows_published=rows, rows_skipped=rows,
        rows_failed=rows_failed, chunks_total=len(plan.chunks), chunks_skipped=len(done),
        wall_s=round(wall_s, 3),
    )  # fmt: skip


def commit_if_published(
    store: ObjectStore,
    ledger: Ledger,
    *,
    settings: RunSettings,
    plan: InputPlan,
    run_key: str,
    wall_s: float = 0.0,
    generation: int = 0,
    supersedes: str | None = None,
) -> RunSummary | None:
    """Commit the run without embedding when every chunk is already published (e.g. a
    re-export of the same rows with new bytes); None when the flow has work to do: a chunk
    to embed, dead letters to send again, a sink to load, or an object gone from the store.

    Every chunk published but dead letters without ``--allow-failed-rows``: nothing to
    embed and nothing to commit, so the run ends here too, as the flow would end it: status
    ``dead_letters``, exit 1 (a rerun of that command took 5 s of Prefect start-up to say so).

    :raises FatalError: the store ignores conditional writes (and that is not allowed).
    :raises ConflictError: an object at a chunk's key, or the manifest's, is something else.
    """
    if getattr(settings, "sink", None):
        return None
    ledger.start_run(run_key, plan, output_uri=store.uri,
                     settings={**settings.model_dump(), "input": plan.source.path,
                               "output": store.uri},
                     flow_run_id=None,
                     object_uris=[store.uri_for(c.object_key) for c in plan.chunks])  # fmt: skip
    done = find_published(plan, run_key=run_key, ledger=ledger, store=store,
                          model=settings.effective_model)  # fmt: skip
    if len(done) < len(plan.chunks):
        return None
    if any(retries_dead_letters(store, o, settings) for o in done.values()):
        return None  # the flow sends them again (DESIGN §8)
    done = with_lengths(store, done)
    if other_lengths(done, run_length(done.values(), settings.dimensions)):
        return None  # the flow embeds the chunks of another length again
    dead = [d for o in done.values() for d in o.dead_letters]
    rows_failed = len(dead)
    blocking = blocking_dead_letters(dead, settings.on_empty_text)
    if blocking and not settings.allow_failed_rows:
        if missing_objects(store, done):
            return None  # the flow re-embeds what went
        return _blocked_by_dead_letters(ledger, store, settings, plan, run_key, done, rows_failed,
                                        blocking, wall_s=wall_s, generation=generation,
                                        supersedes=supersedes)  # fmt: skip
    warning = ensure_conditional_writes(store, allow_unconditional=settings.allow_unconditional_store)
    if warning or missing_objects(store, done):
        return None  # the flow says it loudly, or re-embeds what went
    rows = sum(o.rows for o in done.values())
    with shutdown.interrupts_deferred():  # the commit point and the ledger's record of it
        try:
            committed = commit_run(store, settings=settings, plan=plan, run_key=run_key,
                                   done=done, rows_failed=rows_failed, generation=generation,
                                   supersedes=supersedes)  # fmt: skip
        except MassDeleteError as exc:
            return delete_refused(ledger, store, plan, run_key, done, rows_failed, exc,
                                  wall_s=wall_s)  # fmt: skip
        ledger.finish_run(run_key, status="complete", rows_published=rows,
                          rows_failed=rows_failed, manifest_uri=committed.uri)  # fmt: skip
        shutdown.note_committed(run_key, committed.uri, "nothing to resume")
    return RunSummary(
        exit_code=0, status="complete",
        message="; ".join(filter(None, (
            "every chunk was already published: committed without embedding",
            committed_dead_letters_note(rows_failed, rows_failed - blocking)))),
        rows_empty=rows_failed - blocking,
        run_key=run_key, output=store.uri, manifest_uri=committed.uri, rows_total=plan.rows,
        rows_published=rows, rows_skipped=rows, rows_failed=rows_failed,
        chunks_total=len(plan.chunks), chunks_skipped=len(done),
        dimensions=committed.dimensions, wall_s=round(wall_s, 3),
        price_per_million_tokens=settings.price_per_million_tokens,
        generation=generation, supersedes=supersedes, **change_fields(committed.manifest),
    )  # fmt: skip


def ledger_catches_up(ledger_path: str | os.PathLike[str], manifest: dict[str, Any],
                      uri: str) -> bool:  # fmt: skip
    """Record in the ledger at ``ledger_path`` that the run of ``manifest`` (found in the
    store at ``uri``) is ``complete``, with its counts, if the ledger says otherwise.

    The manifest's PUT is the commit point (DESIGN §4) and the ledger's write comes after
    it: a process killed, or stopped by a second signal, between the two left the run
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
                str(manifest["run_key"]), manifest_uri=uri,
                rows_published=int(manifest["rows_published"]),
                rows_failed=int(manifest["rows_failed"]),
            )  # fmt: skip
        finally:
            ledger.close()
    except (OSError, sqlite3.Error):
        return False
