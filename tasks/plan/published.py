"""Which chunks of a plan are already published: the ledger first, then a HEAD per chunk.

No Prefect here, so ``embedline run`` can ask before starting it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from adapters.ledger import Ledger
from embedline.models import (
    RETRYABLE_DEAD_LETTERS,
    ChunkOutcome,
    ChunkSpec,
    InputPlan,
    chunk_generation,
)
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from tasks.publish.chunk_object import adopt_existing, read_chunk_metadata

__all__ = ["find_published", "retries_dead_letters"]

_HEAD_THREADS = 16


def find_published(
    plan: InputPlan, *, run_key: str, ledger: Ledger, store: ObjectStore, model: str
) -> dict[int, ChunkOutcome]:
    """Return the chunks already published under ``store``, by index, without embedding.

    The ledger answers first; a chunk it does not know is looked up in the store (HEAD), so
    a rerun with a fresh ledger still skips published chunks (docs/reference/output-layout.md).
    Objects found only in the store are recorded in the ledger. A chunk with retryable dead letters
    is described by its newest generation (docs/reference/output-layout.md, "Generations").

    :raises ConflictError: an object at a chunk's key is not that chunk.
    """
    found: dict[int, ChunkOutcome] = {}
    unknown: list[ChunkSpec] = []
    for spec in plan.chunks:
        record = ledger.published_object(store.uri_for(spec.object_key))
        if record is None:
            unknown.append(spec)
            continue
        found[spec.index] = ChunkOutcome(
            index=spec.index,
            key=spec.key,
            object_key=spec.object_key,
            object_sha256=record.sha256,
            rows=record.rows,
            dead_letters=tuple(ledger.chunk_dead_letters(spec)),
            created=False,
        )
    with ThreadPoolExecutor(_HEAD_THREADS) as pool:
        exists = list(pool.map(lambda s: store.head_sha256(s.object_key) is not None, unknown))
    for spec, present in zip(unknown, exists, strict=True):
        if present:
            found[spec.index] = adopt_existing(store, spec, model=model)
    for index, outcome in list(found.items()):
        if any(d.reason in RETRYABLE_DEAD_LETTERS for d in outcome.dead_letters):
            found[index] = _newest_generation(store, plan.chunks[index], outcome, model)
    for spec in plan.chunks:
        adopted = found.get(spec.index)
        if adopted is not None:
            ledger.record_published(
                run_key, spec, adopted, object_uri=store.uri_for(adopted.object_key)
            )
    return found


def _newest_generation(
    store: ObjectStore, spec: ChunkSpec, outcome: ChunkOutcome, model: str
) -> ChunkOutcome:
    """The outcome of the newest generation of ``spec`` in the store
    (docs/reference/output-layout.md, "Generations"): a chunk whose dead letters were retried has
    ``….g1.parquet``, ``….g2.parquet``, …; one ``HEAD`` per generation, only for chunks with
    retryable dead letters."""
    generation = chunk_generation(outcome.object_key)
    while store.head_sha256(replace(spec, generation=generation + 1).object_key) is not None:
        generation += 1
    if generation == chunk_generation(outcome.object_key):
        return outcome
    return adopt_existing(store, replace(spec, generation=generation), model=model)


def retries_dead_letters(store: ObjectStore, outcome: ChunkOutcome, settings: RunSettings) -> bool:
    """Should this run send a published chunk's dead letters again (docs/reference/output-layout.md,
    "Generations")? Only those of kind rejected/too_long/server_error, and only with
    ``--retry-dead-letters`` or when the object's dead letters were made under other request
    settings (one GET)."""
    if not any(d.reason in RETRYABLE_DEAD_LETTERS for d in outcome.dead_letters):
        return False
    if settings.retry_dead_letters:
        return True
    recorded = read_chunk_metadata(store.get(outcome.object_key)).request_settings
    return bool(recorded) and recorded != settings.request_fingerprint
