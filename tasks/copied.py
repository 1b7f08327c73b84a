"""Publish a chunk whose every row the reuse stage copied, without reading the input again.

Planning kept each chunk's ids, text hashes and text sizes (``adapters.row_facts``
``chunk_rows``); the reuse stage copied a vector for every non-empty row
(``tasks.gather``). That is all a chunk object holds when the run keeps no columns beside
the vectors, so the chunk is assembled from those two files: no CSV parse, no request. A
chunk read again would give the same rows (planning hashed the bytes it read; a chunk read
compares them with ``bytes_sha256``), and the object is content-addressed by those rows.

Anything else — kept columns or ``--keep-text`` (their values are in the input only), a copy
whose full text hash is not the planned one (a 64-bit prefix collision, an object rewritten
since it was indexed) — returns None: the caller runs the chunk the ordinary way
(``tasks.chunk.run_chunk``), which parses and sends what it must.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from adapters.row_facts import chunk_rows
from embedline.keys import row_key
from embedline.models import EMPTY_TEXT, ChunkOutcome, ChunkSpec, DeadLetter, InputSource, Row
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from tasks.embed import EmbeddedRows
from tasks.gather import Prefill
from tasks.paid import PaidRequests, chunk_name
from tasks.publish import publish_chunk

__all__ = ["publish_copied"]


def publish_copied(spec: ChunkSpec, source: InputSource, settings: RunSettings, *,
                   store: ObjectStore, scratch: str | None, prefill: str | None,
                   width: int | None, run_key: str | None, logger: Any) -> ChunkOutcome | None:
    """Publish ``spec`` from planning's rows (``scratch``) and the copied vectors
    (``prefill``, ``width`` long); None when that cannot be done (module docstring).

    :raises ConflictError: the chunk's key holds an object that is not this chunk.
    :raises RetryableError, FatalError: the store failed.
    """
    if (source.kept_columns or source.keep_text or scratch is None or prefill is None
            or width is None):
        return None
    batch = chunk_rows(scratch, spec.index)
    ids = batch.column("id").to_pylist()
    hashes = batch.column("text_sha256").to_pylist()
    sizes = batch.column("utf8_bytes").to_numpy()
    empty = batch.column("empty").to_numpy(zero_copy_only=False)
    if len(ids) != spec.rows:
        return None
    vectors = _copies(Prefill(width, path=prefill), hashes, empty, width)
    if vectors is None:
        return None
    model, dims = settings.effective_model, settings.dimensions
    rows, dead = [], []
    for position, (row_id, text_hash) in enumerate(zip(ids, hashes, strict=True)):
        number = spec.first_row + position
        if empty[position]:
            dead.append(DeadLetter(number, row_id, EMPTY_TEXT))
        else:
            rows.append(Row(number, 0, row_id, "", text_hash))
    kept = vectors[~empty]
    embedded = EmbeddedRows(rows, np.ascontiguousarray(kept, dtype=np.float32),
                            [row_key(r.id, r.text_sha256, model, dims) for r in rows], dead)
    outcome = publish_chunk(store, spec, embedded, model=model, dimensions=width,
                            request_settings=settings.request_fingerprint, rows_sent=0)
    if run_key:  # requests an earlier attempt kept: in the object now, as run_chunk does
        PaidRequests(store, run_key, chunk_name(spec.object_key)).clear()
    saved = int(np.maximum(1, np.ceil(sizes[~empty] / 3)).sum())
    logger.info("chunk %d: %d rows published%s, %d dead letters, 0 requests (every row "
                "copied)", spec.index, outcome.rows,
                "" if outcome.created else " (object already existed)", len(dead))
    return replace(outcome, reused=len(rows), tokens_saved=saved)


def _copies(prefill: Prefill, hashes: list[str], empty: np.ndarray, width: int
            ) -> np.ndarray | None:
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
    planned = np.frombuffer(bytes.fromhex("".join(hashes[p] for p in positions)),
                            dtype=np.uint8).reshape(-1, 32)
    if not (records["sha256"] == planned).all():
        return None
    out = np.zeros((len(hashes), width), dtype=np.float32)
    out[positions] = records["vector"]
    return out
