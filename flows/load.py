"""The load stage: a committed run → a vector-store sink, resumable chunk by chunk (DESIGN §8).

Runs after the manifest commit inside ``embed-csv`` (``embedline run … --sink URI``) and as
its own flow ``load-run`` (``embedline load RUN --to URI``). Orchestration only:

1. open the sink, create its table if absent, refuse another model or length (exit 3);
2. choose the mode: ``changes`` when the run's change set is relative to the run this sink
   last finished loading (upsert added and changed rows, delete removed ids), else
   ``replace`` (upsert every row, then delete rows that other runs wrote);
3. one ``load-chunk-NNNN`` task per chunk not yet loaded into this sink for this run; the
   ledger records each chunk after its sink transaction committed (never loaded again);
4. when every chunk is loaded: the deletes, the index, and the load is recorded complete.

A crash anywhere resumes on the next load: chunk upserts are idempotent by id, and steps 4's
deletes are idempotent too.
"""

from __future__ import annotations

import hashlib
import io
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.futures import wait
from prefect.states import Completed, Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from adapters.ledger import Ledger
from embedline import shutdown
from embedline.errors import ConflictError, EmbedlineError
from embedline.models import LoadDeadLetter, LoadSummary, ManifestChunk, load_dead_letters_end
from embedline.protocols import VectorSink
from tasks.chunk import store_for
from tasks.load import LoadedChunk, LoadJob, load_chunk, sink_for
from tasks.outcome import status_for
from tasks.read import resolve_run

__all__ = ["load_run", "load_stage"]


@flow(name="load-run", log_prints=False)
def load_run(
    to: str,
    run: str | None = None,
    output: str = "./embedline-output",
    ledger: str = ".embedline/ledger.sqlite3",
    allow_failed_rows: bool = False,
    lancedb_keep_versions_s: float | None = None,
) -> State[Any]:
    """Load committed run ``run`` (key or ≥ 8-hex prefix; default the latest) of ``output``
    into the sink ``to``. Returns a Completed or Failed state carrying the ``LoadSummary``.

    ``allow_failed_rows``: rows the sink refuses for good (load dead letters) do not make
    the load fail (exit 0). ``lancedb_keep_versions_s``: LanceDB versions older than this
    (seconds) are pruned after the load (default 3,600)."""
    shutdown.take_over_sigterm()  # run by the CLI: its SIGTERM handling, not Prefect's
    started = time.monotonic()
    try:
        manifest = resolve_run(store_for(output), run)
    except EmbedlineError as exc:
        return final_state(LoadSummary(exc.exit_code, "input_error", str(exc), sink=to))
    book = Ledger(ledger)
    try:
        summary = load_stage(output=output, manifest=manifest, sink_uri=to, ledger=book,
                             allow_failed_rows=allow_failed_rows,
                             keep_versions_s=lancedb_keep_versions_s)
    finally:
        book.close()
    summary.wall_s = round(time.monotonic() - started, 3)
    return final_state(summary)


def final_state(summary: LoadSummary) -> State[Any]:
    """Completed (exit 0) or Failed, carrying the summary dict."""
    if summary.exit_code == 0:
        return Completed(message=summary.message or summary.status, data=summary.to_dict())
    return Failed(message=summary.message, data=LoadNotComplete(summary.to_dict()))


class LoadNotComplete(Exception):
    """The data of a Failed ``load-run`` state (Prefect re-raises a failed run's data)."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(summary["message"])
        self.summary = summary


def load_stage(
    *, output: str, manifest: dict[str, Any], sink_uri: str, ledger: Ledger,
    allow_failed_rows: bool = False, keep_versions_s: float | None = None,
) -> LoadSummary:
    """Load the run of ``manifest`` (published under ``output``) into ``sink_uri``.

    Call inside a flow run. Never raises for an expected failure: the summary says it.
    Rows the sink refuses for good are load dead letters: the rest is loaded and the load
    finishes; the summary says ``dead_letters``, exit 1, unless ``allow_failed_rows``.
    """
    logger = get_run_logger()
    started = time.monotonic()
    run_key = str(manifest["run_key"])
    chunks = [ManifestChunk(**{f: e[f] for f in ManifestChunk.__slots__})
              for e in manifest["chunks"]]  # fmt: skip
    base = LoadSummary(0, "loading", "", sink=sink_uri, run_key=run_key,
                       chunks_total=len(chunks))  # fmt: skip
    try:
        sink = sink_for(sink_uri)
        sink.ensure_table(embedder=str(manifest.get("embedder")), model=str(manifest["model"]),
                          dimensions=int(manifest["dimensions"]))  # fmt: skip
    except EmbedlineError as exc:
        return _with(base, started, exit_code=exc.exit_code,
                     status="fatal" if exc.exit_code == 3 else "failed", message=str(exc))
    base.sink = sink.identity
    try:
        job = _job(output, sink, manifest, ledger)
    except EmbedlineError as exc:
        return _with(base, started, exit_code=exc.exit_code, status="fatal", message=str(exc))
    record = ledger.start_load(sink.identity, run_key, mode=job.mode)
    if record.state == "loaded":
        logger.info("run %s is already loaded into %s", run_key, sink.identity)
        return load_dead_letters_end(_with(
            base, started, status="already_loaded", mode=record.mode, chunks_skipped=len(chunks),
            rows_skipped=sum(c.rows for c in chunks),
            message="the run was already loaded into this sink"),
            ledger.load_dead_letters(sink.identity, run_key), allow_failed_rows)
    done = ledger.loaded_chunks(sink.identity, run_key)
    todo = [c for c in chunks if c.index not in done]
    logger.info("loading run %s into %s (%s): %d of %d chunks already loaded", run_key,
                sink.identity, job.mode, len(done), len(chunks))  # fmt: skip
    loaded, failed = _load_chunks(todo, job, sink, ledger)
    summary = _with(base, started, mode=job.mode, rows_loaded=sum(loaded.values()),
                    rows_skipped=sum(done.values()), chunks_loaded=len(loaded),
                    chunks_skipped=len(done), chunks_failed=len(failed))  # fmt: skip
    if failed:
        fatal = [f for f in failed.values() if f.kind == "fatal"]
        first = (fatal or list(failed.values()))[0]
        return _with(summary, started, exit_code=3 if fatal else 1, status="incomplete",
                     message=f"{len(failed)} of {len(chunks)} chunks not loaded ({first.error})"
                             "; rerun the same command to load only those")  # fmt: skip
    try:
        deleted = _delete_stale(sink, job, manifest)
        sink.finalize(keep_versions_s=keep_versions_s)
    except EmbedlineError as exc:
        return _with(summary, started, exit_code=exc.exit_code if exc.exit_code == 3 else 1,
                     status="incomplete", message=f"{exc}; rerun the same command to finish")
    total = sum(c.rows for c in chunks)
    ledger.finish_load(sink.identity, run_key, rows_loaded=total, rows_deleted=deleted)
    dead = ledger.load_dead_letters(sink.identity, run_key)
    if dead:
        _dead_letters_artifact(dead)
    return load_dead_letters_end(_with(summary, started, status="loaded", rows_deleted=deleted),
                             dead, allow_failed_rows)


def _dead_letters_artifact(dead: list[LoadDeadLetter]) -> None:
    """The ``embedline-load-dead-letters`` table artifact (ids and reasons, never text)."""
    create_table_artifact([{"chunk": d.chunk_index, "id": d.id[:200], "reason": d.reason,
                            "sqlstate": d.sqlstate, "message": d.message} for d in dead[:1000]],
                          key="embedline-load-dead-letters",
                          description=f"{len(dead)} rows the sink refuses (no text)")


def _job(output: str, sink: VectorSink, manifest: dict[str, Any], ledger: Ledger) -> LoadJob:
    """The load's mode: ``changes`` when the run's change set is relative to the run this
    sink last finished loading (the ledger's record), else ``replace``."""
    run_key = str(manifest["run_key"])
    changes = manifest.get("changes") or {}
    base = changes.get("base_run_key")
    # Either mode gives the same rows when the sink holds the base run, so a resumed load
    # may switch modes; a load superseded by another is restarted by ``start_load``.
    if not base or base != ledger.last_loaded_run(sink.identity):
        return LoadJob(output=output, sink=sink.identity, run_key=run_key, mode="replace")
    table = _change_set(output, changes)
    upsert = pc.is_in(table.column("change"), pa.array(["added", "changed"]))
    return LoadJob(output=output, sink=sink.identity, run_key=run_key, mode="changes",
                   upsert_ids=frozenset(table.filter(upsert).column("id").to_pylist()))


def _change_set(output: str, changes: dict[str, Any]) -> pa.Table:
    """The run's change set (``id``, ``change``, ``text_sha256``), checked by SHA-256.

    :raises ConflictError: the object's bytes differ from the manifest's record.
    """
    store = store_for(output)
    body = store.get(str(changes["object"]))
    if hashlib.sha256(body).hexdigest() != changes["sha256"]:
        raise ConflictError(f"{store.uri_for(str(changes['object']))} does not match its "
                            "manifest's SHA-256")  # fmt: skip
    return pq.read_table(io.BytesIO(body), columns=["id", "change"])


def _load_chunks(
    todo: list[ManifestChunk], job: LoadJob, sink: VectorSink, ledger: Ledger
) -> tuple[dict[int, int], dict[int, Any]]:
    """Run ``load-chunk`` tasks, ``sink.parallel_loads`` at a time; record each in the
    ledger as it finishes. Stops submitting after a fatal failure."""
    logger = get_run_logger()
    loaded: dict[int, int] = {}
    failed: dict[int, Any] = {}
    window = max(1, sink.parallel_loads)
    with ThreadPoolTaskRunner(max_workers=window) as runner:
        for start in range(0, len(todo), window):
            wave = todo[start:start + window]
            futures = [runner.submit(load_chunk, {"chunk": c, "job": job}) for c in wave]
            wait(futures)
            for chunk, future in zip(wave, futures, strict=True):
                state = future.state
                if not state.is_completed():
                    exc = state.result(raise_on_failure=False)
                    failed[chunk.index] = status_for(exc if isinstance(exc, BaseException) else
                                                     RuntimeError(f"state {state.type.value}"))
                    logger.error("chunk %d not loaded: %s", chunk.index, failed[chunk.index].error)
                    continue
                done: LoadedChunk = future.result()
                ledger.mark_chunk_loaded(job.sink, job.run_key, chunk.index, chunk_key=chunk.key,
                                         rows=done.rows, dead_letters=done.dead_letters)
                loaded[chunk.index] = done.rows
            if any(f.kind == "fatal" for f in failed.values()):
                break
    return loaded, failed


def _delete_stale(sink: VectorSink, job: LoadJob, manifest: dict[str, Any]) -> int:
    """Delete what the run does not contain; return rows deleted. ``changes``: the change
    set's removed ids; ``replace``: every row another run wrote."""
    if job.mode == "replace":
        return sink.delete_other_runs(job.run_key)
    table = _change_set(job.output, manifest["changes"])
    removed = table.filter(pc.equal(table.column("change"), "removed")).column("id")
    return sink.delete_ids(removed.to_pylist()) if len(removed) else 0


def _with(summary: LoadSummary, started: float, **changes: Any) -> LoadSummary:
    return LoadSummary(**{**summary.to_dict(), **changes,
                          "wall_s": round(time.monotonic() - started, 3)})  # fmt: skip
