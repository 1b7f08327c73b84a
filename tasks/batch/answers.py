"""Batch API mode in the chunk task: the chunk's batch results as its embedding client.

The chunk task runs as in synchronous mode (reuse, in-chunk duplicates, request batches,
dead letters, publish), but its client answers each text from the chunk's batch output
files, matched by ``custom_id`` to the request the ledger recorded for the batch (its
``layout``: which rows it carried, ``tasks.batch.requests``) and then by the SHA-256 of the
text as sent, never by order, nor by how today's settings would batch the rows: no request
is sent and nothing is paid again. A text whose
batch rejected it alone gets the rejection (a dead letter, as a synchronous 400). A text
no batch answered (the flow submits the rest before the chunk runs, so only with
``--batch-fallback sync``, or when a reused vector was missing) goes to the synchronous
client when one is given, else fails the chunk (a rerun submits it again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from adapters.embeddings.openai_batch import BatchClient
from embedline.errors import BadResponseError, RetryableError, RowError
from embedline.models import ChunkBatches, Row
from embedline.protocols import EmbeddingClient, EmbeddingClientBase, Embeddings
from embedline.settings import RunSettings
from tasks.batch.outputs import OUTPUTS
from tasks.batch.requests import BatchResults, Resolved, layout_requests, sent_text_sha256
from tasks.batch.rounds import unanswered_message

__all__ = ["BatchAnswers", "batch_answers"]


class BatchAnswers(EmbeddingClientBase):
    """An ``EmbeddingClient`` over ``resolved`` batch results (see the module docstring).

    ``batch_tokens`` counts the tokens of the batch answers it handed out (at the batch
    price). Each answer's ``Embeddings`` counts the texts batches answered as ``inputs``
    (sent, through the Batch API) and only synchronous fallback calls as ``requests``;
    ``fallback`` builds the synchronous client for unanswered texts (None: they
    fail the chunk with ``RetryableError``).
    """

    def __init__(
        self,
        resolved: Resolved,
        *,
        model: str,
        dimensions: int | None,
        fallback: Callable[[], EmbeddingClient] | None = None,
    ) -> None:
        self.model, self.dimensions = model, dimensions
        self._resolved, self._fallback = resolved, fallback
        self._sync: EmbeddingClient | None = None
        self.batch_tokens = 0
        self.batch_inputs = 0  # texts answered from the batches (not sent again)

    @property
    def accepted_requests(self) -> int:  # type: ignore[override]  # read-only: a count
        """Requests the batches ran: answers, and inputs rejected alone (a batch's error
        file names the request it refused, so a rejection is that input's, not a refusal
        of every request; a parameter the server refuses fails the batch's validation)."""
        sync = self._sync.accepted_requests if self._sync is not None else 0
        return len(self._resolved.vectors) + len(self._resolved.rejected) + (sync or 0)

    def embed(
        self,
        texts: Sequence[str],
        *,
        idempotency_key: str,
        expect_dimensions: int | None = None,
        before_send: Callable[[], None] | None = None,
    ) -> Embeddings:
        """One vector per text from the batch results (see the class docstring);
        ``before_send`` goes with the synchronous fallback's requests (nothing else is
        sent).

        :raises RowError: a text of ``texts`` was rejected alone by its batch.
        :raises RetryableError: a text has no answer and there is no synchronous fallback.
        :raises BadResponseError: an answer's length is not ``expect_dimensions``.
        """
        hashes = [sent_text_sha256(t) for t in texts]
        for h in hashes:
            if h in self._resolved.rejected:
                status, message = self._resolved.rejected[h]
                raise RowError(
                    "rejected",
                    http_status=status,
                    detail=f"HTTP {status} in the batch's error file {message}".strip(),
                )
        found: list[np.ndarray | None] = []
        tokens = 0
        for h in hashes:
            answer = self._resolved.vectors.get(h)
            found.append(None if answer is None else answer[0])
            tokens += 0 if answer is None else answer[1]
        missing = [i for i, v in enumerate(found) if v is None]
        sync = Embeddings(np.zeros((0, 0), dtype=np.float32))
        if missing:
            sync = self._send(texts, missing, idempotency_key, expect_dimensions, before_send)
            for i, vector in zip(missing, sync.vectors, strict=True):
                found[i] = vector
        width = expect_dimensions or self.dimensions
        if width is not None and any(len(v) != width for v in found if v is not None):
            raise BadResponseError(f"a batch answer is not {width} long")
        self.batch_tokens += tokens
        self.batch_inputs += len(texts) - len(missing)
        # no None left in `found`: the missing ones raised above
        vectors = np.ascontiguousarray(np.stack(found), dtype=np.float32)  # type: ignore[arg-type]
        # the texts a batch answered were sent (and billed, at the batch price): counted as
        # inputs sent like the synchronous ones
        return Embeddings(
            vectors,
            tokens=tokens + sync.tokens,
            requests=sync.requests,
            inputs=len(texts) - len(missing) + sync.inputs,
            batch_tokens=tokens,
            batch_inputs=len(texts) - len(missing),
        )

    def _send(
        self,
        texts: Sequence[str],
        missing: list[int],
        key: str,
        expect_dimensions: int | None,
        before_send: Callable[[], None] | None,
    ) -> Embeddings:
        if self._fallback is None:
            raise RetryableError(unanswered_message(len(missing)))
        if self._sync is None:
            self._sync = self._fallback()
        if len(missing) < len(texts):  # another request than the batch's: another key
            key = hashlib.sha256(f"{key}:rest:{missing}".encode()).hexdigest()
        return self._sync.embed(
            [texts[i] for i in missing],
            idempotency_key=key,
            expect_dimensions=expect_dimensions,
            before_send=before_send,
        )


def batch_answers(
    rows: Sequence[Row],
    settings: RunSettings,
    batches: ChunkBatches,
    *,
    client: BatchClient,
    fallback: Callable[[], EmbeddingClient] | None,
) -> BatchAnswers:
    """The chunk's ``BatchAnswers``: the requests its batches carried (``batches.layout``,
    rebuilt from ``rows``) resolved against the output and error files ``batches.files``
    of every batch the chunk had, read with ``client`` (the chunk's lines of a file that
    packs many chunks: ``tasks.batch.outputs``, each file read once per process).

    :raises RetryableError, FatalError: a file could not be read.
    :raises BadResponseError: a file's answer is malformed.
    """
    results = BatchResults()
    for file_id in batches.files:
        content = (
            client.file_content(file_id)
            if batches.chunk is None
            else OUTPUTS.lines(
                client.file_content, getattr(client, "base_url", ""), file_id, batches.chunk
            )
        )
        results.add_output(content, dimensions=settings.dimensions, chunk=batches.chunk)
    resolved = results.resolve(layout_requests(rows, batches.layout, settings))
    return BatchAnswers(
        resolved, model=settings.effective_model, dimensions=settings.dimensions, fallback=fallback
    )
