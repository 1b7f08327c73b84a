"""The Batch API calls of one run's stage, each answer recorded in the ledger as it comes:
polls, result files, and the adoption of a batch a crashed or failed create made.

Exactly once: a create has no idempotency key, so a part is recorded before its create and
every batch carries ``metadata`` (run key and the range of chunk indexes it packs, plus chunk
key, index and part when it carries one part: ``batch_metadata``). A part still ``creating``
(a crash, a create that failed or timed out) whose input was uploaded is looked for in the
account's batch list by that upload (``listed_inputs``: the batch created from it) and
adopted; only a part no batch carries is submitted. ``embedline cancel-batches`` finds a
run's batches the same way.

The ledger is a cache: the provider's list is the truth of which batches a run has. A chunk
the ledger records no batch of (a fresh or lost ledger, a part recorded but never
uploaded) is looked for in the list too (``BatchCalls.unrecorded``: this run's batches
created within the completion window that can still answer and whose chunk range holds the
chunk), and each such batch is adopted, per part of the chunk its input file's lines name
(``tasks.batch.requests.split_input``), with the requests those lines carry
(``tasks.batch.requests.layout_from_input``), never assumed from today's settings.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from adapters.embeddings.openai_batch import BatchClient
from adapters.ledger import BatchRecord, Ledger
from embedline.errors import UnknownBatchError
from embedline.models import ChunkSpec
from tasks.batch.requests import split_input

__all__ = [
    "BatchCalls",
    "batch_metadata",
    "listed_inputs",
    "run_batches_listed",
    "usable",
]

Log = logging.Logger | logging.LoggerAdapter  # type: ignore[type-arg]
_LIST_BACK_S = 31 * 86400  # how far back the account's batches are listed to adopt one
#: How far back a batch the ledger does not record is looked for, seconds: the 24 h completion
#: window, and an hour for a batch still finalizing and for the local clock's skew.
WINDOW_S = 25 * 3600
_ENDED_EARLY = frozenset({"expired", "cancelled"})  # ended; useful only if requests completed
_KEPT_INPUTS = 3  # input files kept read while chunks adopt the batches that pack them


def batch_metadata(run_key: str, units: Sequence[tuple[ChunkSpec, int]]) -> dict[str, str]:
    """The ``metadata`` every batch of embedline carries, for its ``units`` (chunk, part):
    the run and the range of chunk indexes it packs (``"first-last"``), and the chunk's key,
    index and part when it carries one part. How the run's batches are found in the
    account's list (at most 16 keys of 512 characters: OpenAI)."""
    indexes = [spec.index for spec, _ in units]
    metadata = {"embedline_run": run_key, "embedline_chunks": f"{min(indexes)}-{max(indexes)}"}
    if len(units) == 1:
        ((spec, part),) = units
        metadata |= {
            "embedline_chunk": spec.key,
            "embedline_index": str(spec.index),
            "embedline_part": str(part),
        }
    return metadata


def _chunk_range(meta: dict[str, Any]) -> tuple[int, int] | None:
    first, _, last = str(meta.get("embedline_chunks") or "").partition("-")
    return (int(first), int(last)) if first.isdigit() and last.isdigit() else None


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


def listed_inputs(client: BatchClient, run_key: str) -> dict[str, dict[str, Any]]:
    """The account's batches of run ``run_key`` by the input file they were created from
    (the newest of each, back 31 days): how a part recorded ``creating`` with its upload is
    found and adopted, by a run or ``cancel-batches``, whatever else the batch packs.

    :raises RetryableError, FatalError: the list could not be read.
    """
    found: dict[str, dict[str, Any]] = {}
    for batch in run_batches_listed(client, run_key):
        if (batch.get("metadata") or {}).get("embedline_run") == run_key and batch.get(
            "input_file_id"
        ):
            found.setdefault(str(batch["input_file_id"]), batch)
    return found


class BatchCalls:
    """Run ``run_key``'s calls to the Batch API ``client``, recorded in ``ledger``; the
    account's list is read once and kept until ``forget_listing``."""

    def __init__(self, client: BatchClient, ledger: Ledger, run_key: str, log: Log) -> None:
        self.client, self.ledger, self.run_key, self.log = client, ledger, run_key, log
        self._listed: dict[str, dict[str, Any]] | None = None
        self._run_list: list[dict[str, Any]] | None = None  # this run's, in the window
        # input files read, by id, split by chunk and part (``split_input``)
        self._inputs: OrderedDict[str, dict[int | None, dict[int | None, bytes]]] = OrderedDict()

    def find(self, spec: ChunkSpec, part: int, input_file_id: str) -> dict[str, Any] | None:
        """The account's batch of this run created from ``input_file_id`` (the part's
        upload: exactly the requests it carries, with the other parts packed with it)."""
        if self._listed is None:
            self._listed = listed_inputs(self.client, self.run_key)
        return self._listed.get(input_file_id)

    def input_of(self, batch: dict[str, Any], chunk: int, part: int) -> bytes:
        """The lines of chunk ``chunk``'s part ``part`` (plain custom_ids) in the input file
        a listed batch was created from (what it carries for that part); all its lines when
        they name no chunk (a batch of one chunk made before parts were packed).

        :raises UnknownBatchError: the file is gone (deleted by its owner).
        """
        lines = self._input(str(batch["input_file_id"]))
        return lines.get(chunk, {}).get(part) or lines.get(None, {}).get(None) or b""

    def _input(self, file_id: str) -> dict[int | None, dict[int | None, bytes]]:
        """An input file's lines by chunk and part, the last few files kept: the chunks a
        batch packs each read it."""
        content = self._inputs.get(file_id)
        if content is None:
            content = split_input(self.client.file_content(file_id))
            self._inputs[file_id] = content
            while len(self._inputs) > _KEPT_INPUTS:
                self._inputs.popitem(last=False)
        self._inputs.move_to_end(file_id)
        return content

    def unrecorded(self, spec: ChunkSpec) -> dict[int, dict[str, Any]]:
        """By part of the chunk, the newest ``usable`` batch of this run created within the
        completion window that carries it and that the ledger does not record for the
        chunk: a batch a lost ledger's run created. A batch of one part names it in its
        ``metadata``; a batch that packs several is read (its input file's lines name their
        chunk and part) when its chunk range holds the chunk. The list is read once per
        stage.

        :raises UnknownBatchError: a packed batch's input file is gone.
        """
        if self._run_list is None:
            self._run_list = run_batches_listed(self.client, self.run_key, back_s=WINDOW_S)
        known = {r.batch_id for r in self.ledger.run_batches(self.run_key, spec.index)}
        found: dict[int, dict[str, Any]] = {}
        for batch in self._run_list:
            meta = batch.get("metadata") or {}
            if (
                meta.get("embedline_run") != self.run_key
                or batch.get("id") in known
                or not batch.get("input_file_id")
                or not usable(batch)
            ):
                continue
            if "embedline_index" in meta:  # one part, named
                if meta.get("embedline_chunk") != spec.key or meta.get("embedline_index") != str(
                    spec.index
                ):
                    continue
                try:
                    found.setdefault(int(meta["embedline_part"]), batch)  # newest first
                except (KeyError, TypeError, ValueError):
                    continue
                continue
            span = _chunk_range(meta)
            if span is None or not span[0] <= spec.index <= span[1]:
                continue
            for part in self._input(str(batch["input_file_id"])).get(spec.index, {}):
                if part is not None:
                    found.setdefault(part, batch)  # newest first
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
