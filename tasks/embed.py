"""Embed one chunk's rows: skip empty texts, batch the rest, isolate rows the API rejects.

Pure chunk logic over an ``EmbeddingClient``: no Prefect, no store. The chunk task
(``tasks/chunk.py``) wraps it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from adapters.embeddings import estimate_tokens
from embedline.errors import BadResponseError, RowError
from embedline.keys import request_key, row_key
from embedline.models import DeadLetter, Row
from embedline.protocols import EmbeddingClient

__all__ = ["EmbeddedRows", "batches", "embed_rows"]


@dataclass(slots=True)
class EmbeddedRows:
    """A chunk after embedding: ``rows`` kept (input order) and their ``vectors``.

    ``vectors`` is float32 of shape ``(len(rows), dimensions)``; ``row_keys`` are the rows'
    idempotency keys; ``tokens`` as reported by the API; ``requests`` HTTP attempts made.
    """

    rows: list[Row]
    vectors: np.ndarray
    row_keys: list[str]
    dead_letters: list[DeadLetter] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0


def batches(
    rows: Sequence[Row], *, batch_size: int, max_request_tokens: int
) -> Iterator[list[Row]]:
    """Split ``rows`` into consecutive batches of at most ``batch_size`` rows and at most
    ``max_request_tokens`` estimated tokens (a single larger row goes alone)."""
    batch: list[Row] = []
    budget = 0
    for row in rows:
        tokens = estimate_tokens(row.text)
        if batch and (len(batch) == batch_size or budget + tokens > max_request_tokens):
            yield batch
            batch, budget = [], 0
        batch.append(row)
        budget += tokens
    if batch:
        yield batch


class _Embedder:
    """Sends batches, bisecting a rejected batch until the rejected rows stand alone."""

    def __init__(self, client: EmbeddingClient, model: str, dimensions: int | None) -> None:
        self.client = client
        self.model = model
        self.dimensions = dimensions
        self.vectors: dict[int, np.ndarray] = {}
        self.dead_letters: list[DeadLetter] = []
        self.tokens = 0
        self.requests = 0

    def keys(self, batch: Sequence[Row]) -> list[str]:
        return [row_key(r.id, r.text_sha256, self.model, self.dimensions) for r in batch]

    def embed(self, batch: list[Row]) -> None:
        try:
            result = self.client.embed(
                [r.text for r in batch], idempotency_key=request_key(self.keys(batch))
            )
        except RowError as exc:
            self._isolate(batch, exc)
            return
        self.tokens += result.tokens
        self.requests += result.requests
        for row, vector in zip(batch, result.vectors, strict=True):
            self.vectors[row.row_number] = vector

    def _isolate(self, batch: list[Row], exc: RowError) -> None:
        if len(batch) == 1:
            row = batch[0]
            self.dead_letters.append(
                DeadLetter(row.row_number, row.id, exc.reason, exc.http_status, attempts=1)
            )
            return
        middle = len(batch) // 2
        self.embed(batch[:middle])
        self.embed(batch[middle:])


def embed_rows(
    rows: Sequence[Row],
    client: EmbeddingClient,
    *,
    model: str,
    dimensions: int | None,
    batch_size: int,
    max_request_tokens: int,
) -> EmbeddedRows:
    """Embed a chunk's ``rows``; return the embedded rows in input order and the dead letters.

    Empty or whitespace-only texts are never sent: they become ``empty_text`` dead letters
    (DESIGN §5). A batch answered with a row-permanent error (400/413/422) is bisected until
    the rejected rows are isolated; they become dead letters, the rest are embedded.

    :raises RetryableError: a request still failed after the client's attempt budget.
    :raises BadResponseError: batches disagree on the vector length.
    :raises FatalError: from the client (credentials, quota, model).
    """
    embedder = _Embedder(client, model, dimensions)
    sendable = []
    for row in rows:
        if row.text.strip():
            sendable.append(row)
        else:
            embedder.dead_letters.append(DeadLetter(row.row_number, row.id, "empty_text"))
    for batch in batches(sendable, batch_size=batch_size, max_request_tokens=max_request_tokens):
        embedder.embed(batch)
    kept = [r for r in rows if r.row_number in embedder.vectors]
    vectors = _stack([embedder.vectors[r.row_number] for r in kept], dimensions)
    return EmbeddedRows(
        rows=kept,
        vectors=vectors,
        row_keys=embedder.keys(kept),
        dead_letters=sorted(embedder.dead_letters, key=lambda d: d.row_number),
        tokens=embedder.tokens,
        requests=embedder.requests,
    )


def _stack(vectors: list[np.ndarray], dimensions: int | None) -> np.ndarray:
    if not vectors:
        return np.zeros((0, dimensions or 0), dtype=np.float32)
    lengths = {len(v) for v in vectors}
    if len(lengths) != 1:
        raise BadResponseError(f"batches returned vectors of different lengths {sorted(lengths)}")
    return np.ascontiguousarray(np.stack(vectors), dtype=np.float32)
