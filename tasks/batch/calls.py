"""The Batch API calls of one run's stage, each answer recorded in the ledger as it comes:
polls, result files, and the adoption of a batch a crashed or failed create made.

Exactly once: a create has no idempotency key, so a part is recorded before its create and
every batch carries ``metadata`` (run key, chunk key, chunk index, part: ``batch_metadata``).
A part still ``creating`` (a crash, a create that failed or timed out) is looked for in the
account's batch list (``listed_parts``) and adopted; only a part no batch carries is
submitted. ``embedline cancel-batches`` finds a run's batches the same way.

The ledger is a cache: the provider's list is the truth of which batches a run has. A chunk
the ledger records no batch of (a fresh or lost ledger, a part recorded but never
uploaded) is looked for in the list too (``BatchCalls.unrecorded``: this run's and chunk's
batches created within the completion window that can still answer), and each such batch
is adopted with the requests its own input file carries
(``tasks.batch.requests.layout_from_input``), never assumed from today's settings.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from adapters.embeddings.openai_batch import BatchClient
from adapters.ledger import BatchRecord, Ledger
from embedline.errors import UnknownBatchError
from embedline.models import ChunkSpec

__all__ = ["BatchCalls", "batch_metadata", "listed_parts", "run_batches_listed", "usable"]

Log = logging.Logger | logging.LoggerAdapter  # type: ignore[type-arg]
_LIST_BACK_S = 31 * 86400  # how far back the account's batches are listed to adopt one
#: How far back a batch the ledger does not record is looked for, seconds: the 24 h completion
#: window, and an hour for a batch still finalizing and for the local clock's skew.
WINDOW_S = 25 * 3600
_ENDED_EARLY = frozenset({"expired", "cancelled"})  # ended; useful only if requests completed


def batch_metadata(run_key: str, spec: ChunkSpec, part: int) -> dict[str, str]:
    """The ``metadata`` every batch of embedline carries: how a crashed or timed-out create
    is recognized in the account's list (at most 16 keys of 512 characters: OpenAI)."""
    return {
        "embedline_run": run_key,
        "embedline_chunk": spec.key,
        "embedline_index": str(spec.index),
        "embedline_part": str(part),
    }


def run_batches_listed(
    client: BatchClient, run_key: str, *, back_s: float = _LIST_BACK_S
) -> list[dict[str, Any]]:
    """The account's batches whose ``metadata`` names run ``run_key`` (a key, or a prefix of
    at least 8 hex characters: ``cancel-batches`` with no ledger), newest first, created
    within ``back_s`` seconds (the list is newest first: it is read no further back).

    :raises RetryableError, FatalError: the list could not be read.
    """
    found = []
    oldest = time.time() - back_s
    for batch in client.list_batches():
        if int(batch.get("created_at") or 0) < oldest:
            break
        run = (batch.get("metadata") or {}).get("embedline_run")
        if isinstance(run, str) and run.startswith(run_key):
            found.append(batch)
    return found


def usable(batch: dict[str, Any]) -> bool:
    """Whether ``batch`` can still answer a request: running, completed, or ended early
    (expired, cancelled) after completing some; a ``failed`` batch ran nothing."""
    status = batch.get("status")
    if status == "failed":
        return False
    if status in _ENDED_EARLY:
        return int((batch.get("request_counts") or {}).get("completed") or 0) > 0
    return True


def listed_parts(client: BatchClient, run_key: str) -> dict[tuple[int, int], dict[str, Any]]:
    """The account's batches of run ``run_key`` by (chunk index, part), as their
    ``metadata`` says (``batch_metadata``): the newest of each, back 31 days. How a part
    recorded ``creating`` (a crash or a create that failed between the provider's create
    and the ledger's record) is found and adopted, by a run or ``cancel-batches``.

    :raises RetryableError, FatalError: the list could not be read.
    """
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for batch in run_batches_listed(client, run_key):
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
        self._run_list: list[dict[str, Any]] | None = None  # this run's, in the window

    def find(self, spec: ChunkSpec, part: int, input_file_id: str) -> dict[str, Any] | None:
        """The account's batch that carries this run's, chunk's and part's metadata and was
        created from ``input_file_id`` (the part's upload: exactly the requests it carries)."""
        if self._listed is None:
            self._listed = listed_parts(self.client, self.run_key)
        batch = self._listed.get((spec.index, part))
        return batch if batch is not None and batch.get("input_file_id") == input_file_id else None

    def input_of(self, batch: dict[str, Any]) -> bytes:
        """The input file a listed batch was created from (what it carries).

        :raises UnknownBatchError: the file is gone (deleted by its owner).
        """
        return self.client.file_content(str(batch["input_file_id"]))

    def unrecorded(self, spec: ChunkSpec) -> dict[int, dict[str, Any]]:
        """By part, the newest ``usable`` batch of this run and chunk (its key and index in
        ``metadata``) created within the completion window whose id the ledger does not
        record: a batch a lost ledger's run created. The list is read once per stage."""
        if self._run_list is None:
            self._run_list = run_batches_listed(self.client, self.run_key, back_s=WINDOW_S)
        known = {r.batch_id for r in self.ledger.run_batches(self.run_key) if r.batch_id}
        found: dict[int, dict[str, Any]] = {}
        for batch in self._run_list:
            meta = batch.get("metadata") or {}
            if (
                meta.get("embedline_run") != self.run_key
                or meta.get("embedline_chunk") != spec.key
                or meta.get("embedline_index") != str(spec.index)
                or batch.get("id") in known
                or not batch.get("input_file_id")
                or not usable(batch)
            ):
                continue
            try:
                found.setdefault(int(meta["embedline_part"]), batch)  # newest first
            except (KeyError, TypeError, ValueError):
                continue
        return found

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
