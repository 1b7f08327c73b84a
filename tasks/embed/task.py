"""The chunk task: read a chunk's rows, embed them, publish its object. Runs on any worker.

It takes a small frozen ``ChunkSpec`` (byte offsets, not rows) plus settings, builds its
adapters itself (shared per process), and returns a ``ChunkOutcome``. It never touches the
ledger: only the flow process writes it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import replace
from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.states import Cancelled, Completed, Failed

from adapters.csv_chunks import read_chunk
from adapters.embeddings import build_batch_client, build_embedder
from adapters.object_store import open_store
from embedline import progress
from embedline.errors import FatalError, StopRequestedError
from embedline.models import ChunkBatches, ChunkOutcome, ChunkSpec, InputSource, ReusePlan, Row
from embedline.protocols import EmbeddingClient, ObjectStore
from embedline.settings import RunSettings
from embedline.shutdown import STOP
from embedline.tracebacks import CHUNK_TASK_NAME, GROUP_TASK_NAME, quiet_expected_tracebacks
from tasks.batch.answers import BatchAnswers, batch_answers
from tasks.embed.dask_worker import worker_label
from tasks.embed.failures import (
    group_retry_condition,
    name_the_worker,
    retry_condition,
    retryable,
    stops_group,
)
from tasks.embed.groups import ChunkGroup, GroupOutcome
from tasks.embed.paid import PaidRequests, chunk_name, keep_handed, take_paid
from tasks.embed.rows import EmbeddedRows, embed_rows, merged
from tasks.embed.spent import SpendRecords, fenced, spending
from tasks.lease.chunk_lease import ChunkLeaseLost, take_chunk_lease
from tasks.lease.run_stop import RunStop
from tasks.publish.chunk_object import adopt_existing, publish_chunk
from tasks.reuse.chunk_side import (
    Reused,
    combine,
    drop_other_lengths,
    split_duplicates,
    take_prefill,
    take_reused,
)

__all__ = [
    "embed_chunk",
    "embed_chunks",
    "run_chunk",
    "run_group",
    "show_published_chunk",
    "store_for",
    "warm_worker",
]

#: Outcomes of the chunks a group's earlier attempts ended, by task run id, for its retry
#: (Prefect retries a task run in the process that ran it): a retry runs only the chunks
#: that failed with a retryable error. Taken by the next attempt; kept only while the task
#: run has a retry left.
_EARLIER_ATTEMPTS: dict[Any, dict[int, ChunkOutcome | BaseException]] = {}
_EARLIER_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def store_for(uri: str) -> ObjectStore:
    """Return this process's store for ``uri`` (one client and connection pool per URI)."""
    return open_store(uri)


@task(
    name=CHUNK_TASK_NAME,
    task_run_name="embed-chunk-{spec.index:04d}",
    cache_policy=NO_CACHE,
    retry_condition_fn=retry_condition,
)
def embed_chunk(
    spec: ChunkSpec,
    source: InputSource,
    settings: RunSettings,
    reuse: ReusePlan | None = None,
    dimensions: int | None = None,
    run_key: str | None = None,
    batches: ChunkBatches | None = None,
    stop_key: str | None = None,
) -> ChunkOutcome | State[None]:
    """Embed chunk ``spec`` of ``source`` and publish it; return what was published.

    ``batches`` (Batch API mode): the result files of every batch of the chunk and the
    requests they carried; its texts are answered from them, not sent
    (``tasks.batch.answers``).

    ``dimensions`` is the run's vector length as the flow knew it at submission (None:
    unknown yet; ``tasks/publish/dimensions.py``): every vector published must have it. Reused
    vectors of another length are sent again; an answer of another length fails the chunk
    as a bad response, nothing published. Unknown, the chunk's first answer sets it.

    ``reuse`` (decided by the flow process's reuse stage, ``tasks/reuse/stage.py``) names
    the file of vectors copied for the chunk's rows and the in-run owners it waits for;
    rows with a text already sent in this chunk are copied; the rest are sent
    (``tasks/reuse/chunk_side.py``). With ``run_key`` (the run's key), each successful
    request's vectors are kept in the store until the chunk is published, and rows an
    earlier attempt of this chunk kept are not sent again (``tasks/embed/paid.py``). A chunk
    that the stopping run released (its grace period ran out: ``StopRequestedError``
    before its next request) returns a Cancelled state, Prefect's state for work stopped
    on request, so the UI does not list it as Failed. ``stop_key`` (a run on Dask): the
    run's stop marker (``tasks/lease/run_stop.py``); once it exists the chunk does not start
    (Cancelled).

    :raises InputError: the input changed since planning.
    :raises RetryableError: the API kept failing past the attempt budget (Prefect may retry
        the task; see ``retry_condition``).
    :raises BadResponseError: the API answered with wrong shapes or values.
    :raises FatalError: credentials, quota, model or store refusals; the run stops.
    :raises ConflictError: the chunk's key holds an object that is not this chunk.
    """
    if stop_key and RunStop(store_for(settings.output), stop_key).stopped():
        return Cancelled(message="the run is stopping: the chunk was not started")
    try:
        return run_chunk(
            spec,
            source,
            settings,
            reuse,
            dimensions,
            run_key,
            batches,
            logger=get_run_logger(),
            leased=settings.task_runner == "dask",
        )
    except StopRequestedError as exc:
        return Cancelled(message=f"{type(exc).__name__}: {exc}")


@task(
    name=GROUP_TASK_NAME,
    task_run_name="embed-chunks-{group.first:04d}-{group.last:04d}",
    cache_policy=NO_CACHE,
    retry_condition_fn=group_retry_condition,
)
def embed_chunks(
    group: ChunkGroup,
    source: InputSource,
    settings: RunSettings,
    reuse: tuple[ReusePlan | None, ...],
    dimensions: int | None = None,
    run_key: str | None = None,
    batches: tuple[ChunkBatches | None, ...] | None = None,
    stop_key: str | None = None,
) -> GroupOutcome | State[Any]:
    """Embed and publish the chunks of ``group`` one after another (``run_group``), each as
    ``embed_chunk`` does (``reuse[i]`` and ``batches[i]`` are chunk ``i``'s); return what
    each did (``GroupOutcome``), as the run's state: Completed when every chunk published,
    Failed when one failed (Prefect retries the group if one failed with a retryable error;
    the retry runs only those chunks), else Cancelled (the run is stopping: chunks not
    started are given back). ``stop_key``: as ``embed_chunk``'s, looked for before each chunk.
    """
    context = TaskRunContext.get()
    run_id = context.task_run.id if context is not None else None
    retry_left = context is not None and context.task_run.run_count <= context.task.retries
    earlier = _take_earlier(run_id)
    outcome = run_group(
        group,
        source,
        settings,
        reuse,
        dimensions,
        run_key,
        batches,
        logger=get_run_logger(),
        earlier=earlier,
        stop=RunStop(store_for(settings.output), stop_key) if stop_key else None,
    )
    failures = outcome.failures()
    failed = [e for e in failures if not isinstance(e, StopRequestedError)]
    retried = any(retryable(e) for e in failures) and not any(stops_group(e) for e in failures)
    if retried and retry_left:  # as group_retry_condition decides
        _keep_for_retry(run_id, group, outcome)
    if failed:
        return Failed(data=outcome, message=_failed_message(group, outcome))
    if failures or None in outcome.outcomes:
        return Cancelled(data=outcome, message="the run is stopping: chunks given back")
    return outcome


def _take_earlier(run_id: Any) -> dict[int, ChunkOutcome | BaseException]:
    """The outcomes an earlier attempt of task run ``run_id`` kept for this one (or none).
    A function of its own, not code in the task: the task's function is pickled by value
    for Dask, with the globals it names, and a lock cannot be pickled."""
    with _EARLIER_LOCK:
        return _EARLIER_ATTEMPTS.pop(run_id, {})


def _keep_for_retry(run_id: Any, group: ChunkGroup, outcome: GroupOutcome) -> None:
    """Keep what the retry of task run ``run_id`` does not run again: every chunk's outcome
    but those failed with a retryable error and those not started."""
    with _EARLIER_LOCK:
        _EARLIER_ATTEMPTS[run_id] = {
            s.index: o
            for s, o in zip(group.specs, outcome.outcomes, strict=True)
            if o is not None and not retryable(o)
        }


def run_group(
    group: ChunkGroup,
    source: InputSource,
    settings: RunSettings,
    reuse: tuple[ReusePlan | None, ...],
    dimensions: int | None,
    run_key: str | None,
    batches: tuple[ChunkBatches | None, ...] | None = None,
    *,
    logger: Any,
    earlier: dict[int, ChunkOutcome | BaseException] | None = None,
    stop: RunStop | None = None,
) -> GroupOutcome:
    """``embed_chunks``'s body, without Prefect: ``run_chunk`` for each chunk of ``group``
    in order, its exception kept as its outcome. ``earlier``: outcomes of an earlier
    attempt, kept (those chunks are not run again). Stops before the next chunk when one
    failed with an error that stops the run or released it (``stops_group``), or when the
    run is stopping (the dispatcher's stop in this process, or ``stop``: its marker in the
    store, for a worker of another machine); the chunks after are None."""
    earlier = earlier or {}
    outcomes: list[ChunkOutcome | BaseException | None] = []
    stopped = False
    for n, spec in enumerate(group.specs):
        if spec.index in earlier:
            outcomes.append(earlier[spec.index])
            continue
        if (
            stopped
            or STOP.dispatch.new_chunks_held()
            or STOP.dispatch.tasks_must_stop()
            or (stop is not None and stop.stopped())
        ):
            outcomes.append(None)
            continue
        try:
            outcomes.append(
                run_chunk(
                    spec,
                    source,
                    settings,
                    reuse[n],
                    dimensions,
                    run_key,
                    batches[n] if batches is not None else None,
                    logger=logger,
                    leased=getattr(settings, "task_runner", None) == "dask",
                )
            )
        except Exception as exc:  # noqa: BLE001 - the chunk's outcome: status_for reads it
            outcomes.append(exc)
            stopped = stops_group(exc)
    return GroupOutcome(tuple(outcomes))


def _failed_message(group: ChunkGroup, outcome: GroupOutcome) -> str:
    """The Failed state's message: how many chunks failed, and the first one's error."""
    failed = [
        (s.index, o)
        for s, o in zip(group.specs, outcome.outcomes, strict=True)
        if isinstance(o, BaseException) and not isinstance(o, StopRequestedError)
    ]
    index, error = failed[0]
    return (
        f"{len(failed)} of {len(group.specs)} chunks failed; chunk {index}: "
        f"{type(error).__name__}: {error}"
    )


def run_chunk(
    spec: ChunkSpec,
    source: InputSource,
    settings: RunSettings,
    reuse: ReusePlan | None,
    dimensions: int | None,
    run_key: str | None,
    batches: ChunkBatches | None = None,
    *,
    logger: Any,
    leased: bool = False,
) -> ChunkOutcome:
    """``embed_chunk``'s body, without Prefect: also what the flow process runs itself for
    a chunk whose every row the reuse stage copied (``flows/local_chunks.py``: no task
    run, nothing to send). ``logger``: a logger or Prefect's run logger. Raises as
    ``embed_chunk``, and ``StopRequestedError`` (the run is stopping).

    ``leased`` (a chunk task on Dask, with ``run_key``): the chunk's lease is taken first,
    so no two copies of the chunk send at once (``tasks/lease/chunk_lease.py``), and what
    it sends is recorded in the store (``tasks/embed/spent.py``). A copy that finds the
    chunk published by another adopts its object."""
    quiet_expected_tracebacks()  # this process may be a Dask worker
    if not (leased and run_key):
        return _run_chunk(spec, source, settings, reuse, dimensions, run_key, batches, logger)
    try:
        return _run_leased(spec, source, settings, reuse, dimensions, run_key, batches, logger)
    except FatalError as exc:
        if settings.cluster_apart:
            name_the_worker(exc, worker_label())
        raise


def _run_leased(
    spec: ChunkSpec,
    source: InputSource,
    settings: RunSettings,
    reuse: ReusePlan | None,
    dimensions: int | None,
    run_key: str,
    batches: ChunkBatches | None,
    logger: Any,
) -> ChunkOutcome:
    """``run_chunk`` of a chunk on Dask: under its lease, its requests recorded."""
    store = store_for(settings.output)
    chunk = chunk_name(spec.object_key)
    while True:
        lease = take_chunk_lease(
            store,
            run_key,
            chunk,
            published=lambda: store.head_sha256(spec.object_key) is not None,
            log=logger,
        )
        if lease is None:  # another copy published it: nothing to send
            logger.info("chunk %d: published by another copy of its task", spec.index)
            return adopt_existing(store, spec, model=settings.effective_model)
        spent = SpendRecords(store, run_key, chunk, check=lease.check)
        try:
            return _run_chunk(
                spec, source, settings, reuse, dimensions, run_key, batches, logger, spent
            )
        except ChunkLeaseLost as exc:
            logger.warning("chunk %d: %s; waiting for it", spec.index, exc)
        finally:
            spent.flush()  # the last answer's tokens and retries
            lease.release()


def _run_chunk(
    spec: ChunkSpec,
    source: InputSource,
    settings: RunSettings,
    reuse: ReusePlan | None,
    dimensions: int | None,
    run_key: str | None,
    batches: ChunkBatches | None,
    logger: Any,
    spent: SpendRecords | None = None,
) -> ChunkOutcome:
    """``run_chunk``'s work; with ``spent`` (a leased chunk), each request is recorded
    there after the lease's check, and the lease is checked again before publishing."""
    store = store_for(settings.output)
    rows = read_chunk(source, spec)
    expected = settings.dimensions or dimensions
    plan = reuse or ReusePlan()
    paid = PaidRequests(store, run_key, chunk_name(spec.object_key)) if run_key else None
    found = take_prefill(rows, plan)
    found.merge(
        take_reused(
            store, rows, plan, model=settings.effective_model, dimensions=expected, run_key=run_key
        )
    )
    if paid is not None and found.handed:  # kept as ours too, should this chunk fail
        keep_handed(
            paid,
            [r for r in rows if r.row_number in found.handed],
            found.vectors,
            model=settings.effective_model,
            dimensions=settings.dimensions,
        )
    rest = [r for r in rows if r.row_number not in found.vectors]
    if paid is not None:  # an earlier attempt paid for these: not sent again
        found.take_paid(
            take_paid(
                paid,
                rest,
                model=settings.effective_model,
                dimensions=settings.dimensions,
                length=expected,
            )
        )
        rest = [r for r in rest if r.row_number not in found.vectors]
    # the last request's vectors go straight into the object: written to the store only
    # if the chunk fails first (tasks/embed/paid.py)
    with paid.keep_held_on_failure() if paid is not None else contextlib.nullcontext():
        send, copies = split_duplicates(rest)
        answers = _batch_answers(rows, settings, batches) if send else None
        client = progress.counting((answers or _embedder(settings)) if send else None, spec.index)
        # each request, retries included, after the lease's check; sent requests recorded
        # (batch answers only send their synchronous fallback's)
        client = spending(client, spent) if answers is None else fenced(client, spent)
        # batch answers are kept by the provider (the rerun reads them again): nothing to keep
        embedded = _embed(send, client, settings, expected, paid if answers is None else None)
        if expected is None and embedded.rows:  # learned from the server's first answer
            stale = drop_other_lengths(found, rows, int(embedded.vectors.shape[1]))
            if stale:  # vectors of an older length: this run's are the server's answers
                client = client or spending(
                    progress.counting(_embedder(settings), spec.index), spent
                )
                embedded = merged(
                    embedded, _embed(stale, client, settings, int(embedded.vectors.shape[1]), paid)
                )
        inputs = len(embedded.rows)  # texts this attempt sent and got vectors for
        # of the answers that reported usage
        estimated, bound = embedded.tokens_estimated, embedded.tokens_bound
        sent = inputs + len(found.paid)  # the server embedded these for the object
        embedded = combine(
            rows,
            embedded,
            found,
            copies,
            model=settings.effective_model,
            dimensions=settings.dimensions,
        )
        if embedded.rows:
            dimensions = int(embedded.vectors.shape[1])
        else:
            dimensions = expected or int(getattr(client, "dimensions", None) or 0)
        if spent is not None:
            spent.check()  # still the holder: another copy may have taken the chunk over
        outcome = publish_chunk(
            store,
            spec,
            embedded,
            model=settings.effective_model,
            dimensions=dimensions,
            request_settings=settings.request_fingerprint,
            rows_sent=sent,
            kept_columns=source.kept_columns,
            keep_text=source.keep_text,
        )
    if paid is not None:
        paid.clear()  # published: what the failed attempts paid for is in the object now
    outcome = replace(
        outcome,
        inputs=inputs,
        reused=found.reused,
        deduplicated=found.deduplicated,
        tokens_saved=found.tokens_saved,
        batch_tokens=answers.batch_tokens if answers is not None else 0,
        batch_inputs=answers.batch_inputs if answers is not None else 0,
        tokens_estimated=estimated,
        tokens_bound=bound,
    )
    logger.info(
        "chunk %d: %d rows published%s, %d dead letters, %d requests, %d tokens%s",
        spec.index,
        outcome.rows,
        "" if outcome.created else " (object already existed)",
        len(outcome.dead_letters),
        outcome.requests,
        outcome.tokens,
        _sources(found),
    )
    return outcome


def _sources(found: Reused) -> str:
    """Where the rows not sent came from, for the chunk's one log line ("" if all were
    sent). One line per chunk, not one per fact: each line also goes through Prefect's
    API log worker to the server and the UI."""
    parts = []
    if found.paid:
        parts.append(f"{len(found.paid)} from requests an earlier attempt paid for")
    if found.reused or found.deduplicated:
        parts.append(
            f"{found.reused} reused from earlier runs, {found.deduplicated} "
            "deduplicated in this run"
        )
    return f" ({'; '.join(parts)})" if parts else ""


def _embedder(settings: RunSettings) -> EmbeddingClient:
    """The process's shared client; on a Dask worker with ``--rpm``/``--tpm``, one whose
    pacer is the cluster's budget (``tasks.embed.cluster_budget``)."""
    pacer = None
    if settings.task_runner == "dask" and (settings.rpm is not None or settings.tpm is not None):
        from tasks.embed.cluster_budget import cluster_pacer

        pacer = cluster_pacer(settings)
    return build_embedder(settings, pacer=pacer)


def _batch_answers(
    rows: list[Row], settings: RunSettings, batches: ChunkBatches | None
) -> BatchAnswers | None:
    """Batch API mode: the chunk's batch results as its client (None in synchronous mode).
    With ``--batch-fallback sync``, texts no batch answered are sent synchronously."""
    if batches is None:
        return None
    fallback = (lambda: _embedder(settings)) if settings.batch_fallback == "sync" else None
    return batch_answers(
        rows, settings, batches, client=build_batch_client(settings), fallback=fallback
    )


def _embed(
    rows: list[Row],
    client: Any,
    settings: RunSettings,
    expected: int | None,
    paid: PaidRequests | None = None,
) -> EmbeddedRows:
    """``embed_rows`` with the run's settings; every answer must be ``expected`` long.
    Nothing to send (every vector reused or copied): no client was built, none is called."""
    if not rows:
        return EmbeddedRows([], np.zeros((0, expected or 0), dtype=np.float32), [])
    return embed_rows(
        rows,
        client,  # None when every row was reused: nothing to send
        model=settings.effective_model,
        dimensions=settings.dimensions,
        batch_size=settings.batch_size,
        max_request_tokens=settings.max_request_tokens,
        max_input_tokens=settings.max_input_tokens if settings.embedder == "openai" else None,
        on_too_long=settings.on_too_long,
        expect_dimensions=expected,
        paid=paid,
    )


@task(name=CHUNK_TASK_NAME, task_run_name="embed-chunk-{spec.index:04d}", cache_policy=NO_CACHE)
def show_published_chunk(spec: ChunkSpec, object_uri: str) -> State[None]:
    """A task run for a chunk published before this run, so the UI lists every chunk.

    Embeds nothing: the ledger or the store already said the chunk is published. Its state
    is Completed, named "Cached", like a Prefect cache hit.
    """
    return Completed(name="Cached", message=f"already published: {object_uri}")


def warm_worker() -> int:
    """Run once in each Dask worker before chunks are submitted: unpickling this function
    imports this module and what a chunk task needs (Prefect's task engine, pyarrow, httpx),
    so the first chunk on each worker does not pay for it. Returns the worker's pid."""
    import os

    import pandas  # noqa: F401 - pyarrow imports it on its first conversion, which blocked
    import prefect.task_engine  # noqa: F401   every other thread of a cold worker on the
    import pyarrow.parquet  # noqa: F401       import lock for ~1 s (py-spy, 20,000 rows)

    return os.getpid()
