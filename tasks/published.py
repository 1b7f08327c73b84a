"""Which chunks of a plan are already published: the ledger first, then a HEAD per chunk.

No Prefect here, so ``embedline run`` can ask before starting it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from adapters.ledger import Ledger
from embedline.models import ChunkOutcome, ChunkSpec, InputPlan
from embedline.protocols import ObjectStore
from tasks.publish import adopt_existing

__all__ = ["find_published"]

_HEAD_THREADS = 16


def find_published(
    plan: InputPlan, *, run_key: str, ledger: Ledger, store: ObjectStore, model: str
) -> dict[int, ChunkOutcome]:
    """Return the chunks already published under ``store``, by index, without embedding.

    The ledger answers first; a chunk it does not know is looked up in the store (HEAD), so
    a rerun with a fresh ledger still skips published chunks (DESIGN §4). Objects found only
    in the store are recorded in the ledger.

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
            index=spec.index, key=spec.key, object_key=spec.object_key,
            object_sha256=record.sha256, rows=record.rows,
            dead_letters=tuple(ledger.chunk_dead_letters(spec)), created=False,
        )  # fmt: skip
    with ThreadPoolExecutor(_HEAD_THREADS) as pool:
        exists = list(pool.map(lambda s: store.head_sha256(s.object_key) is not None, unknown))
    for spec, present in zip(unknown, exists, strict=True):
        if present:
            found[spec.index] = adopt_existing(store, spec, model=model)
    for spec in plan.chunks:
        outcome = found.get(spec.index)
        if outcome is not None:
            ledger.mark_published(
                run_key, spec, object_uri=store.uri_for(spec.object_key),
                sha256=outcome.object_sha256, rows=outcome.rows,
                dead_letters=outcome.dead_letters,
            )  # fmt: skip
    return found
