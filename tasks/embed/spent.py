"""Spend records: what the chunk tasks of a Dask cluster sent, kept in the output store.

A Dask worker counts in its own process, and a worker that is killed, a scheduler that is
lost or a copy of a chunk whose result Dask drops (it gave up on its worker) never reports
what it sent. So on Dask each chunk task writes, as each request goes out (its concurrency
slot held, the rate limiter passed), one empty object whose name holds what it sent and was
answered since its previous record (docs/reference/output-layout.md, "Spend records")::

    _embedline/paid/{run_key}/{chunk_name}.spent/{attempt}.{seq:06d}.{r}_{i}_{t}_{rr}_{ir}

``attempt``: 16 hex, random per chunk attempt; ``seq`` its record number; then, as signed
integers, requests, inputs, tokens, requests retried, inputs retried (``Usage``'s fields).
A request about to be sent counts as one request and its inputs as charged; the record
after it corrects that if it got no vectors (a 5xx past its retries) and adds the
tokens reported and the retries made. The attempt's last record is written when it ends
(``close``). So a worker killed mid-request leaves its request counted as charged, which
it is (the provider finishes what it received); only the tokens of its last answer are
lost.

The flow process sums and deletes every record under the run's key when the dispatch ends
(``drain_spent``): the summary's ``requests``, ``inputs`` and ``tokens`` of a Dask run. A
record written after that (a chunk of a lost scheduler still running) is counted by the
next run of the same run key. Abandoned records are removed by ``embedline gc`` as any
kept request.
"""

from __future__ import annotations

import concurrent.futures
import logging
import secrets
from collections.abc import Sequence
from typing import Any

from embedline.errors import EmbedlineError, StopRequestedError
from embedline.progress import Usage
from embedline.protocols import ObjectStore
from tasks.embed.dask_worker import worker_closing
from tasks.embed.paid import PAID_PREFIX

__all__ = ["SpendRecords", "drain_spent", "fenced", "spending", "spent_prefix"]

logger = logging.getLogger("embedline")
_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # of b""
_FIELDS = 5  # requests, inputs, tokens, requests retried, inputs retried


def spent_prefix(run_key: str, chunk: str) -> str:
    """The prefix of chunk ``chunk``'s spend records (module docstring)."""
    return f"{PAID_PREFIX}{run_key}/{chunk}.spent/"


class SpendRecords:
    """The spend records of one chunk attempt; ``check`` (the chunk lease's) is called
    before each request. Not thread-safe: one chunk task uses it."""

    def __init__(self, store: ObjectStore, run_key: str, chunk: str, check: Any = None) -> None:
        self.store = store
        self.prefix = spent_prefix(run_key, chunk)
        self.attempt = secrets.token_hex(8)
        self._check = check
        self._seq = 0
        self._pending = [0] * _FIELDS

    def check(self) -> None:
        """The lease's fence (``ChunkLease.check``), when there is one: before the publish."""
        if self._check is not None:
            self._check()

    def before_request(self) -> None:
        """Before each request (every attempt): stop once this process is a closing Dask
        worker (``worker_closing``), then ``check``. Not before the publish: a chunk whose
        requests are all answered publishes while its worker closes.

        :raises StopRequestedError: the worker is closing: the chunk is released and sends
            nothing more; its paid requests are kept for the next run.
        :raises ChunkLeaseLost: as ``ChunkLease.check``.
        """
        if worker_closing():
            raise StopRequestedError(
                "this Dask worker is closing (its scheduler went away, or it is shut down); "
                "chunk released for the next run, its paid requests kept"
            )
        self.check()

    def sending(self, inputs: int) -> None:
        """A request of ``inputs`` texts goes out now (its first attempt holds its
        concurrency slot and passed ``before_request``): record it as sent and charged, with
        what is pending."""
        self._add(1, inputs, 0, 0, 0)
        self.flush()

    def answered(self, result: Any, inputs: int) -> None:
        """The request of ``inputs`` texts was answered (``Embeddings``: its ``requests``,
        ``tokens`` and the ``inputs`` of every attempt)."""
        requests = int(getattr(result, "requests", 1) or 1)
        sent = int(getattr(result, "inputs", inputs) or inputs)
        tokens = int(getattr(result, "tokens", 0) or 0)
        self._add(requests - 1, 0, tokens, requests - 1, max(0, sent - inputs))

    def failed(self, exc: BaseException, inputs: int) -> None:
        """The request of ``inputs`` texts got no vectors (``exc`` carries its attempts)."""
        requests = int(getattr(exc, "requests", 0) or 0)
        sent = int(getattr(exc, "inputs", 0) or 0)
        self._add(requests - 1, -inputs, 0, requests, sent)

    def flush(self) -> None:
        """Write what is pending as one record (nothing pending: nothing written). Best
        effort: a store failure logs one warning and keeps it pending."""
        if not any(self._pending):
            return
        counts = "_".join(str(n) for n in self._pending)
        key = f"{self.prefix}{self.attempt}.{self._seq:06d}.{counts}"
        try:
            self.store.put_if_absent(
                key, b"", sha256=_EMPTY_SHA256, content_type="application/octet-stream"
            )
        except (EmbedlineError, OSError) as exc:
            logger.warning("could not record a request under %s: %s", self.prefix, exc)
            return
        self._seq += 1
        self._pending = [0] * _FIELDS

    def _add(self, *counts: int) -> None:
        self._pending = [a + b for a, b in zip(self._pending, counts, strict=True)]


class _FencedClient:
    """An embedding client whose every request, retries included, first passes the
    records' ``check`` (the chunk lease's fence)."""

    def __init__(self, client: Any, records: SpendRecords) -> None:
        self._client = client
        self._records = records

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def embed(self, texts: Sequence[str], **kwargs: Any) -> Any:
        return self._client.embed(texts, before_send=self._records.before_request, **kwargs)


class _SpendingClient(_FencedClient):
    """A fenced client that also writes a spend record around each ``embed`` call: the
    first when its first attempt goes out (``before_send``: it holds its concurrency slot
    and passed the rate limiter), so a worker killed while a request waits for its slot
    leaves nothing counted for it; the last when it is answered or fails."""

    def embed(self, texts: Sequence[str], **kwargs: Any) -> Any:
        records, inputs = self._records, len(texts)
        sent = False

        def before_send() -> None:
            nonlocal sent
            records.before_request()
            if not sent:
                sent = True
                records.sending(inputs)

        try:
            result = self._client.embed(texts, before_send=before_send, **kwargs)
        except BaseException as exc:
            if sent:
                records.failed(exc, inputs)
            raise
        if not sent:  # a client that never called before_send: count the request anyway
            records.sending(inputs)
        records.answered(result, inputs)
        return result


def fenced(client: Any, records: SpendRecords | None) -> Any:
    """``client`` calling ``records.before_request`` (the chunk lease's fence) right before each
    request goes out, every retry included (``EmbeddingClient.embed``'s ``before_send``):
    the check before a spend record is written is not enough, since a request can wait
    long after it (a retry's backoff, a connection that hangs while the network is cut).
    ``None``s stay as they are."""
    if client is None or records is None:
        return client
    return _FencedClient(client, records)


def spending(client: Any, records: SpendRecords | None) -> Any:
    """``client`` fenced as ``fenced`` does and writing ``records`` around each request
    (``None``s stay as they are)."""
    if client is None or records is None:
        return client
    return _SpendingClient(client, records)


def parse_spent(key: str) -> tuple[int, ...] | None:
    """The five counts of a spend record's key, or None for any other key."""
    if ".spent/" not in key:
        return None
    parts = key.rsplit("/", 1)[-1].split(".")
    if len(parts) != 3:
        return None
    try:
        counts = tuple(int(n) for n in parts[2].split("_"))
    except ValueError:
        return None
    return counts if len(counts) == _FIELDS else None


def drain_spent(store: ObjectStore, run_key: str, *, threads: int = 16) -> Usage:
    """Sum and delete the spend records of run ``run_key``: what its chunk tasks sent
    (``Usage``; batch fields 0). Deletes are best effort (gc removes what is left).

    :raises EmbedlineError: the store could not be listed.
    """
    totals = [0] * _FIELDS
    keys = []
    for info in store.list(f"{PAID_PREFIX}{run_key}/"):
        counts = parse_spent(info.key)
        if counts is None:
            continue
        keys.append(info.key)
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
    if keys:
        with concurrent.futures.ThreadPoolExecutor(min(threads, len(keys))) as pool:
            list(pool.map(store.discard_scratch, keys))
    requests, inputs, tokens, retried, resent = totals
    return Usage(
        requests=requests,
        tokens=tokens,
        inputs=inputs,
        requests_retried=retried,
        inputs_retried=resent,
    )
