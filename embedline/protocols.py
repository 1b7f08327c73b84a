"""Interfaces between the stages and the adapters (``typing.Protocol``: fakes need not inherit)."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from embedline.errors import FatalError

__all__ = [
    "AliasState",
    "AliasSwitch",
    "EmbeddingClient",
    "EmbeddingClientBase",
    "Embeddings",
    "ObjectInfo",
    "ObjectStore",
    "PutResult",
    "RequestLimits",
    "SinkColumns",
    "SinkTable",
    "UpsertResult",
    "VectorSink",
]


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One request's result: ``vectors`` float32 of shape ``(len(texts), dimensions)``.

    ``tokens`` is the API's reported usage (0 when the server reports none); ``requests``
    counts HTTP attempts made for it, retries included (0 for an in-process model);
    ``inputs`` the texts those attempts carried (``len(texts)`` for an in-process model).
    ``batch_tokens`` and ``batch_inputs``: of ``tokens`` and ``inputs``, those Batch API
    batches answered (sent and billed at the batch price, no request of this call).
    """

    vectors: np.ndarray
    tokens: int = 0
    requests: int = 0
    inputs: int = 0
    batch_tokens: int = 0
    batch_inputs: int = 0


class RequestLimits(Protocol):
    """Per-request limits a client learned from its server (``adapters.embeddings.RequestCaps``):
    the chunk logic reads them before every batch and reports what a bisection proved."""

    def limits(self, batch_size: int, max_request_tokens: int) -> tuple[int, int]:
        """Return (inputs, estimated tokens) allowed per request: the settings, lowered by
        what was learned."""
        ...

    def learn(self, *, rejected: int, inputs: int, tokens: int | None, status: int | None) -> None:
        """Record that ``rejected`` inputs in one request were refused (HTTP ``status``) while
        requests of ``inputs`` inputs (``tokens`` estimated tokens, when tokens were the
        limit) worked."""
        ...


class EmbeddingClient(Protocol):
    """Embeds one batch of texts; retries and classifies failures itself.

    Clients without a server (the local model, test fakes) can take the defaults of
    ``EmbeddingClientBase``.
    """

    model: str

    @property
    def dimensions(self) -> int | None:
        """Vector length when known (requested, or the local model's 384)."""
        ...

    @property
    def caps(self) -> RequestLimits | None:
        """Limits learned from the server's refusals, shared by every caller; None when the
        client learns none."""
        ...

    @property
    def whole_chunk(self) -> bool:
        """True if the client wants a chunk's texts in one ``embed`` call (it batches them
        itself, and then takes ``on_rows``, a callable told the texts done after each pass)."""
        ...

    @property
    def accepted_requests(self) -> int | None:
        """Requests of this client that got a well-formed 2xx answer so far; None when the
        client sends no requests or does not count them."""
        ...

    def embed(
        self,
        texts: Sequence[str],
        *,
        idempotency_key: str,
        expect_dimensions: int | None = None,
        before_send: Callable[[], None] | None = None,
    ) -> Embeddings:
        """Return one vector per text, in the order of ``texts``; each of
        ``expect_dimensions`` components when given (the run's length).

        ``before_send`` (a chunk lease's fence on a Dask cluster) is called right before
        each request goes out, every retry included; what it raises ends the call with
        nothing more sent (its ``requests`` and ``inputs``: what was sent before).

        :raises RowError: the batch holds an input the server rejects (400/413/422).
        :raises RetryableError: still failing after the attempt budget.
        :raises BadResponseError: the response's shape or values are wrong.
        :raises FatalError: credentials, quota or model are wrong.
        """
        ...

    def stop(self, error: FatalError) -> None:
        """Latch ``error`` as if the server had answered it: the client sends nothing more
        and every later ``embed`` raises it again (a no-op for a client without a server)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class EmbeddingClientBase:
    """Defaults of the ``EmbeddingClient`` members a client without a server needs no
    behaviour for: no learned caps, request batches, no request count, nothing to stop.
    Subclasses set ``model`` and ``dimensions`` and define ``embed``."""

    caps: RequestLimits | None = None
    whole_chunk: bool = False
    accepted_requests: int | None = None

    def stop(self, error: FatalError) -> None:
        """Nothing to latch: no request is ever sent."""

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True, slots=True)
class PutResult:
    """Outcome of a conditional create: ``created`` False means identical bytes were there."""

    created: bool
    sha256: str


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object: ``key`` relative to the output root, ``size_bytes``, and
    ``modified`` (Unix time in seconds: S3 ``LastModified``, or a file's mtime)."""

    key: str
    size_bytes: int
    modified: float


class ObjectStore(Protocol):
    """A flat key space under one output root with create-only writes
    (docs/reference/output-layout.md)."""

    uri: str

    def put_if_absent(self, key: str, body: bytes, *, sha256: str, content_type: str) -> PutResult:
        """Create ``key`` with ``body`` unless it exists; never overwrite.

        :raises ConflictError: the key exists with other bytes (SHA-256 differs).
        :raises FatalError: the store refuses the write (permissions, missing bucket).
        """
        ...

    def put_file_if_absent(
        self, key: str, path: str | os.PathLike[str], *, content_type: str
    ) -> PutResult:
        """Create ``key`` with the bytes of the local file ``path`` unless it exists; never
        overwrite. The file is streamed (never read whole into memory) and its SHA-256 is
        computed here and returned in the ``PutResult``: the same conditional create and
        outcomes as ``put_if_absent`` for bodies too large to hold (a change set).

        :raises FileNotFoundError: ``path`` does not exist.
        :raises ConflictError: the key exists with other bytes (SHA-256 differs).
        :raises FatalError: the store refuses the write (permissions, missing bucket).
        """
        ...

    def head_sha256(self, key: str) -> str | None:
        """Return the stored object's SHA-256 (hex), or None if the key does not exist."""
        ...

    def get(self, key: str) -> bytes:
        """Return the object's bytes. :raises FileNotFoundError: if the key does not exist."""
        ...

    def uri_for(self, key: str) -> str:
        """Return the full URI of ``key`` (``s3://bucket/prefix/key`` or a local path)."""
        ...

    def open_read(self, key: str) -> BinaryIO:
        """Return a seekable binary file over the object (ranged reads on S3).

        :raises FileNotFoundError: if the key does not exist.
        """
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Yield every object whose key starts with ``prefix`` (temp files excluded)."""
        ...

    def delete(self, key: str) -> None:
        """Delete the object (garbage collection only; a missing key is not an error)."""
        ...

    def server_now(self) -> float:
        """Return the store's own clock now (Unix s): the clock its ``ObjectInfo.modified``
        comes from (S3: a response's ``Date``; a directory: a probe file's mtime), so an
        object's age is judged by one clock, whatever this host's clock says."""
        ...

    def prepare(self) -> None:
        """Make the output root ready for a run's first write (a local directory is created;
        S3: nothing, a bucket is never created).

        :raises InputError: the root cannot be used (a file in the way, not writable).
        """
        ...

    def sweep_temp_files(
        self, max_age_s: float = 3600.0, *, now: float | None = None
    ) -> builtins.list[str]:  # `list` is the method above
        """Remove temp files that dead writers left (older than ``max_age_s`` seconds, or
        whose process is gone); return their locations (``[]`` where a write is atomic)."""
        ...

    def discard_scratch(self, key: str) -> None:
        """Delete a scratch key under ``_embedline/``, best effort (a failure is logged).

        :raises ValueError: ``key`` is not a scratch key (real objects are never deleted).
        """
        ...


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """The columns a sink table holds beside embedline's own (docs/reference/sinks.md): ``kept`` CSV
    columns (their names as in the CSV), and ``text`` (the embedded text) when ``text``.

    A table holding kept columns also holds ``kept_sha256`` (``template.kept_sha256`` of
    each row's kept values): with ``id`` and ``text_sha256`` the key a load decides by, so a
    row whose kept values changed is loaded again though its text did not change.
    """

    kept: tuple[str, ...] = ()
    text: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """The columns in table order: the kept ones, then ``text``."""
        return self.kept + (("text",) if self.text else ())

    def describe(self) -> str:
        """``title, section and the text`` / ``no kept columns``, for messages."""
        parts = [repr(c) for c in self.kept] + (["the text"] if self.text else [])
        return ", ".join(parts) if parts else "no kept columns"


@dataclass(frozen=True, slots=True)
class SinkTable:
    """What a sink table says about its vectors: who embedded them, their length, its rows,
    and the columns it keeps beside them."""

    embedder: str | None  # None: a table embedline did not create (no metadata)
    model: str | None
    dimensions: int
    rows: int
    columns: SinkColumns = SinkColumns()


@dataclass(frozen=True, slots=True)
class UpsertResult:
    """What one ``upsert`` did: ``rows`` written; ``refused`` the rows the store refuses for
    good, as ``(row position in the upserted table, id, reason, sqlstate or None, the store's
    one-line message)``; ``attempts`` the transactions (or savepoints) it took to isolate them
    (1 when nothing was refused)."""

    rows: int
    refused: tuple[tuple[int, str, str, str | None, str], ...] = ()
    attempts: int = 1


class VectorSink(Protocol):
    """A vector store table that embedline loads runs into (docs/reference/sinks.md).

    Rows are ``id`` (unique key), ``embedding`` (``dimensions`` float32), ``text_sha256`` and
    ``run_key`` (the run that last wrote the row), then the table's ``SinkColumns`` (kept
    columns, ``text``) and, with kept columns, ``kept_sha256``. Every method is one
    transaction.
    """

    identity: str  # the sink and table, without secrets: the ledger's key for load state
    table_name: str  # the table (collection) in its store
    parallel_loads: int  # chunk loads that may run at once against this sink

    def ensure_table(
        self, *, embedder: str, model: str, dimensions: int, columns: SinkColumns = SinkColumns()
    ) -> SinkTable:
        """Create the table if absent (with ``columns``); return what it holds.

        :raises FatalError: the existing table holds vectors of another length or model, or
            other kept columns (``adapters.sinks.base.check_compatible``).
        """
        ...

    def describe(self) -> SinkTable | None:
        """Return the table's metadata, or None if the table does not exist."""
        ...

    def upsert(self, rows: pa.Table, *, run_key: str) -> UpsertResult:
        """Insert or replace ``rows`` (``id``, ``embedding``, ``text_sha256`` and the table's
        ``SinkColumns`` names) by id, tagged ``run_key``, in one transaction. Rows the store
        refuses for good (an id it cannot
        store, a vector it refuses) are left out, listed in the result, and any row already
        under their ids is removed, so the table never keeps a stale vector for them.

        :raises FatalError: the table itself is refused (its shape, rights).
        :raises RetryableError: the store was unreachable.
        """
        ...

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete rows by id in one transaction; return how many existed."""
        ...

    def delete_other_runs(self, run_key: str) -> int:
        """Delete every row not tagged ``run_key``; return how many."""
        ...

    def held_keys(self) -> pa.Table:
        """Return every row's ``id`` and ``text_sha256`` (strings), and ``kept_sha256`` for
        a table with kept columns, from one snapshot of the table: what the sink holds,
        which decides every load (docs/reference/sinks.md)."""
        ...

    def finalize(self, *, keep_versions_s: float | None = None) -> str:
        """Build or refresh the table's index after a load (idempotent); a store that keeps
        versions (LanceDB) prunes those older than ``keep_versions_s`` seconds. Returns what
        it did in a few words, for the load summary ("HNSW index built", "compacted")."""
        ...

    def needs_index(self) -> bool:
        """Whether ``finalize`` has an index to build (pgvector: the HNSW index is missing
        or INVALID): part of what the sink holds, so a load of a run the table already holds
        builds it rather than ending ``already_loaded``. False for stores that build none."""
        ...

    def search(
        self,
        vector: np.ndarray,
        k: int,
        *,
        columns: Sequence[str] = (),
        where: Sequence[tuple[str, str]] = (),
        exact: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Return up to ``k`` ``(id, cosine similarity, *values of columns)``, most similar
        first (``columns``: some of the table's ``SinkColumns`` names; none: pairs).
        ``exact``: score every (matching) row, never through an approximate index
        (``embedline search --exact``); without it, the store's usual search (an index may
        miss some of the true nearest: ``embedline recall`` measures how many).

        ``where``: ``(column, value)`` pairs, all of which a row must meet (exact string
        equality on ``id`` or a ``SinkColumns`` name); the hits are the true ``k`` nearest
        among the rows that meet them, never the nearest ``k`` filtered afterwards. Values
        are passed as parameters (or escaped), never pasted into a query."""
        ...

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Return the stored vectors (float32) of those of ``ids`` the table holds, by id
        (``embedline recall`` searches with them)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class AliasState:
    """Where a stable name points in a store: ``current`` table (None: the alias does not
    exist yet) and the ``previous`` one (None: no switch before), for ``--rollback``."""

    alias: str
    current: str | None
    previous: str | None


class AliasSwitch(Protocol):
    """A store's one-step switch of a stable name between its tables (docs/reference/sinks.md, model
    cutover): a view replaced in one transaction (PostgreSQL), a collection alias
    (Qdrant). Readers through the name see the old table or the new one, never a mix."""

    alias: str

    def state(self) -> AliasState:
        """Where the alias points now (no write)."""
        ...

    def check_name(self) -> None:
        """Refuse a name the store already uses for something else (a table, a collection,
        a view embedline did not make), before anything is loaded.

        :raises InputError: naming it.
        """
        ...

    def switch(self, table: str) -> AliasState:
        """Point the alias at ``table`` in one step, remembering the table it pointed at as
        ``previous``; a no-op when it points there already. Returns the new state.

        :raises InputError: the alias names something embedline did not make (a table).
        :raises RetryableError: the store was unreachable.
        """
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
