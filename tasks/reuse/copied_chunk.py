"""Publish a chunk whose every row the reuse stage copied, without reading the input again.

Planning kept each chunk's ids, text hashes and text sizes (``adapters.row_facts``
``chunk_rows``); the reuse stage copied a vector for every non-empty row
(``tasks.reuse.gather``). That is all a chunk object holds when the run keeps no columns beside
the vectors, so the chunk is assembled from those two files: no CSV parse, no request. A
chunk read again would give the same rows (planning hashed the bytes it read; a chunk read
compares them with ``bytes_sha256``), and the object is content-addressed by those rows.

Anything else — kept columns or ``--keep-text`` (their values are in the input only), a copy
whose full text hash is not the planned one (a 64-bit prefix collision, an object rewritten
since it was indexed) — returns None: the caller runs the chunk the ordinary way
(``tasks.embed.task.run_chunk``), which parses and sends what it must.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.row_facts import chunk_rows
from adapters.scratch import digests, hex_digests
from embedline.keys import row_key_digests
from embedline.models import EMPTY_TEXT, ChunkOutcome, ChunkSpec, DeadLetter, InputSource
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from tasks.embed.paid import PaidRequests, chunk_name
from tasks.publish.chunk_object import (
    chunk_parquet_columns,
    fold_fingerprint,
    publish_body,
    reusing_pool,
)
from tasks.reuse.gather import Prefill

__all__ = ["publish_copied"]


def publish_copied(
    spec: ChunkSpec,
    source: InputSource,
    settings: RunSettings,
    *,
    store: ObjectStore,
    scratch: str | None,
    prefill: str | None,
    width: int | None,
    run_key: str | None,
    logger: Any,
) -> ChunkOutcome | None:
    """Publish ``spec`` from planning's rows (``scratch``) and the copied vectors
    (``prefill``, ``width`` long); None when that cannot be done (module docstring).

    :raises ConflictError: the chunk's key holds an object that is not this chunk.
    :raises RetryableError, FatalError: the store failed.
    """
    if (
        source.kept_columns
        or source.keep_text
        or scratch is None
        or prefill is None
        or width is None
    ):
        return None
    batch = chunk_rows(scratch, spec.index)
    empty = batch.column("empty").to_numpy(zero_copy_only=False)
    if batch.num_rows != spec.rows:
        return None
    hashes = batch.column("text_sha256")
    vectors = _copies(Prefill(width, path=prefill), hashes, empty, width)
    if vectors is None:
        return None
    model, dims = settings.effective_model, settings.dimensions
    ids = batch.column("id")
    dead = [
        DeadLetter(spec.first_row + int(p), ids[int(p)].as_py(), EMPTY_TEXT)
        for p in np.flatnonzero(empty)
    ]
    if dead:
        keep = pa.array(~empty)
        ids, hashes = ids.filter(keep), hashes.filter(keep)
    raw = row_key_digests(ids.to_pylist(), hashes.to_pylist(), model, dims)
    keys = hex_digests(raw)
    fingerprint = fold_fingerprint(np.frombuffer(raw, dtype=np.uint8).reshape(-1, 32))
    kept = vectors[~empty] if dead else vectors
    body = chunk_parquet_columns(
        spec,
        ids,
        hashes,
        keys,
        kept,
        dead,
        model=model,
        dimensions=width,
        request_settings=settings.request_fingerprint,
        rows_sent=0,
        rows_xor=fingerprint,
        memory_pool=reusing_pool(),
    )
    outcome = publish_body(
        store,
        spec,
        body,
        rows=len(ids),
        dead_letters=dead,
        model=model,
        dimensions=width,
        rows_sent=0,
        rows_xor=fingerprint,
    )
    if run_key:  # requests an earlier attempt kept: in the object now, as run_chunk does
        PaidRequests(store, run_key, chunk_name(spec.object_key)).clear()
    sizes = batch.column("utf8_bytes").to_numpy()
    saved = int(np.maximum(1, np.ceil(sizes[~empty] / 3)).sum())
    # DEBUG: a line per copied chunk costs the API a log row each (the flow's summary and
    # artifact count them: "N rows reused")
    logger.debug(
        "chunk %d: %d rows published%s, %d dead letters, 0 requests (every row copied)",
        spec.index,
        outcome.rows,
        "" if outcome.created else " (object already existed)",
        len(dead),
    )
    return replace(outcome, reused=len(ids), tokens_saved=saved)


def _copies(prefill: Prefill, hashes: pa.Array, empty: np.ndarray, width: int) -> np.ndarray | None:
    """The copied vectors in row order, float32 ``(len(hashes), width)`` (empty texts'
    rows unset); None unless every non-empty row has exactly one copy whose full hash is
    the planned one."""
    records = prefill.records
    positions = records["position"].astype(np.int64)
    if len(positions) and positions.max() >= len(hashes):
        return None
    covered = np.zeros(len(hashes), dtype=np.int64)
    np.add.at(covered, positions, 1)
    if not ((covered == 1) | (empty & (covered == 0))).all():
        return None
    if not (records["sha256"] == digests(hashes)[positions]).all():
        return None
    out = np.zeros((len(hashes), width), dtype=np.float32)
    out[positions] = records["vector"]
    return out
