"""The Batch API calls of one run's stage, each answer recorded in the ledger as it comes:
polls, result files, and the adoption of a batch a crashed or failed create made.

Exactly once: a create has no idempotency key, so a part is recorded before its create and
every batch carries ``metadata`` (run key, chunk key, chunk index, part: ``batch_metadata``).
A part still ``creating`` (a crash, a create that failed or timed out) is looked for in the
account's batch list (``listed_parts``) and adopted; only a part no batch carries is
submitted. ``embedline cancel-batches`` finds a run's batches the same way.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from adapters.embeddings.openai_batch import BatchClient
from adapters.ledger import BatchRecord, Ledger
from embedline.errors import UnknownBatchError
from embedline.models import ChunkSpec

__all__ = ["BatchCalls", "batch_metadata", "listed_parts"]

Log = logging.Logger | logging.LoggerAdapter  # type: ignore[type-arg]
_LIST_BACK_S = 31 * 86400  # how far back the account's batches are listed to adopt one


def batch_metadata(run_key: str, spec: ChunkSpec, part: int) -> dict[str, str]:
    """The ``metadata`` every batch of embedline carries: how a crashed or timed-out create
    is recognized in the account's list (at most 16 keys of 512 characters: OpenAI)."""
    return {
        "embedline_run": run_key,
        "embedline_chunk": spec.key,
        "embedline_index": str(spec.index),
        "embedline_part": str(part),
    }


def listed_parts(client: BatchClient, run_key: str) -> dict[tuple[int, int], dict[str, Any]]:
    """The account's batches of run ``run_key`` by (chunk index, part), as their
    ``metadata`` says (``batch_metadata``): the newest of each, back 31 days. How a part
    recorded ``creating`` (a crash or a create that failed between the provider's create
    and the ledger's record) is found and adopted, by a run or ``cancel-batches``.

    :raises RetryableError, FatalError: the list could not be read.
    """
    found: dict[tuple[int, int], dict[str, Any]] = {}
    oldest = time.time() - _LIST_BACK_S
    for batch in client.list_batches():
        if int(batch.get("created_at") or 0) < oldest:
            break
        meta = batch.get("metadata") or {}
        if meta.get("embedline_run") != run_key:
            continue
        try:
            key = (int(meta["embedline_index"]), int(meta["embedline_part"]))
        except (KeyError, TypeError, ValueError):
            continue
        found.setdefault(key, batch)
    return found


class BatchCalls:
    """Run ``run_key``'s calls to the Batch API ``client``, recorded in ``ledger``; the
    account's list is read once and kept until ``forget_listing``."""

    def __init__(self, client: BatchClient, ledger: Ledger, run_key: str, log: Log) -> None:
        self.client, self.ledger, self.run_key, self.log = client, ledger, run_key, log
        self._listed: dict[tuple[int, int], dict[str, Any]] | None = None

    def find(self, spec: ChunkSpec, part: int) -> dict[str, Any] | None:
        """The account's batch that carries this run's, chunk's and part's metadata."""
        if self._listed is None:
            self._listed = listed_parts(self.client, self.run_key)
        return self._listed.get((spec.index, part))

    def forget_listing(self) -> None:
        """List the account's batches again at the next ``find`` (a create may have made a
        new one)."""
        self._listed = None

    def adopt(
        self, spec: ChunkSpec, record: BatchRecord, batch: dict[str, Any], *, created: bool = False
    ) -> None:
        """Record ``batch`` as part ``record`` of the chunk: submitted, with its first poll
        (``created``: this stage's own create, else one an earlier attempt made)."""
        self.ledger.mark_batch_submitted(
            self.run_key,
            spec.index,
            record.part,
            batch_id=str(batch["id"]),
            input_file_id=batch.get("input_file_id"),
            status=str(batch.get("status")),
        )
        if not created:
            self.log.info(
                "chunk %d part %d: adopted batch %s, which an earlier attempt created",
                spec.index,
                record.part,
                batch["id"],
            )
        self.record_poll(batch)

    def get_batch(self, record: BatchRecord) -> dict[str, Any]:
        """Poll ``record``'s batch; one the provider does not know is marked ``not_found``.

        :raises UnknownBatchError: naming the batch.
        """
        try:
            return self.client.get_batch(str(record.batch_id))
        except UnknownBatchError:
            self.ledger.mark_batch_not_found(self.run_key, str(record.batch_id))
            raise

    def file(self, record: BatchRecord, file_id: str) -> bytes:
        """A result file of ``record``'s batch; one the provider does not know (deleted) is
        noted on the batch in the ledger.

        :raises UnknownBatchError: naming the file.
        """
        try:
            return self.client.file_content(file_id)
        except UnknownBatchError:
            self.ledger.mark_batch_not_found(self.run_key, str(record.batch_id), file_id=file_id)
            raise

    def record_poll(self, batch: dict[str, Any]) -> None:
        """Record what a poll of ``batch`` answered: status, files, counts, errors."""
        counts = batch.get("request_counts") or {}
        errors = (batch.get("errors") or {}).get("data") or []
        error = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)[:500] or None
        self.ledger.update_batch(
            self.run_key,
            str(batch["id"]),
            status=str(batch.get("status")),
            output_file_id=batch.get("output_file_id"),
            error_file_id=batch.get("error_file_id"),
            completed=int(counts.get("completed") or 0),
            failed=int(counts.get("failed") or 0),
            error=error,
        )
