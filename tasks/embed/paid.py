"""Requests already paid for: their vectors kept in the output store until the chunk publishes.

The exactly-once unit of publishing is the chunk, but what the API bills is the request. A
chunk that fails after some of its requests succeeded (an outage, a 5xx past the attempt
budget, a ``kill -9``) would otherwise pay for those requests again when it is retried,
resumed, or when another chunk of the run embeds the texts it owned (``tasks/reuse/chunk_side.py``).
So every successful request's vectors are written, before the chunk is published, as one
small Parquet object in the output store itself (so it works on Dask workers, on S3 and
after a ``kill -9``), except those of the chunk's last request: they go straight into the
chunk object, milliseconds later, and are written here only if the chunk fails before it
is published (``keep(held=True)``, ``keep_held_on_failure``). Writing them first doubled
every chunk's writes to guard a window of milliseconds: about 1.1 s of the CLI's 8 s of
CPU for the English file, whose chunks are one request each. A ``kill -9`` inside that
window costs the last request again; a failure raised inside it does not::

    _embedline/paid/{run_key}/{chunk_name}/{request_key}.parquet

``chunk_name`` is the chunk object's name without ``chunks/`` and ``.parquet`` (the chunk key,
``….g{N}`` for a later generation). Columns: ``row_key`` (the row's idempotency key,
docs/reference/keys.md), ``text_sha256`` ("" when the writer did not give it) and ``embedding``
(float32, fixed size); schema metadata ``embedline.paid`` holds
``{"tokens", "request_key", "dimensions"}``.

Lifecycle (docs/reference/output-layout.md, "Paid requests"): written by the chunk task after each
successful request but the last (that one only if the chunk then fails); read by the same chunk's
next attempt (a Prefect retry, a resumed run: same run key) and by chunks waiting on it as
the in-run dedup owner; deleted by ``clear`` once the
chunk object is published; abandoned ones (their run has no live lease and they are older
than the grace period) are deleted by ``embedline gc`` (``tasks/gc/retention.py``).

Writes never decide a chunk's outcome: a keep that fails logs one warning and the chunk goes
on (at worst that request is paid again); an unreadable kept object is skipped the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adapters.object_store import SCRATCH_PREFIX
from embedline.errors import EmbedlineError
from embedline.keys import request_key, row_key
from embedline.models import Row
from embedline.protocols import ObjectStore

__all__ = [
    "PAID_PREFIX",
    "PaidRequests",
    "chunk_name",
    "gave_up_key",
    "keep_handed",
    "mark_gave_up",
    "paid_run_key",
    "take_paid",
]

#: Every kept request lives under this prefix (a scratch prefix: only scratch keys are deleted).
PAID_PREFIX = f"{SCRATCH_PREFIX}paid/"
_META = b"embedline.paid"
_PARQUET = "application/vnd.apache.parquet"

logger = logging.getLogger("embedline")


def chunk_name(object_key: str) -> str:
    """``chunks/{key}.parquet`` -> ``{key}``; ``chunks/{key}.g2.parquet`` -> ``{key}.g2``."""
    name = object_key.rsplit("/", 1)[-1]
    return name[: -len(".parquet")] if name.endswith(".parquet") else name


def gave_up_key(run_key: str, chunk_key: str, session: str) -> str:
    """The key of the mark the flow process writes when chunk ``chunk_key`` will not publish
    in the run process ``session`` (a random token per planning process, so a mark of an
    earlier process never stops a later one from waiting)."""
    return f"{PAID_PREFIX}{run_key}/{chunk_key}/gave-up-{session}.json"


def mark_gave_up(store: ObjectStore, run_key: str, chunk_key: str, session: str) -> None:
    """Write the gave-up mark (``gave_up_key``): chunks on other processes (Dask workers)
    waiting for this chunk's object stop waiting and take what it kept. Best effort."""
    key = gave_up_key(run_key, chunk_key, session)
    body = b'{"gave_up": true}'
    try:
        store.put_if_absent(key, body, sha256=_sha256(body), content_type="application/json")
    except (EmbedlineError, OSError) as exc:
        logger.warning("could not mark %s as given up: %s", key, type(exc).__name__)


def paid_run_key(key: str) -> str | None:
    """The run key of a kept request's object key, or None for any other key."""
    if not key.startswith(PAID_PREFIX):
        return None
    parts = key[len(PAID_PREFIX) :].split("/")
    return parts[0] if len(parts) == 3 and parts[0] else None


@dataclass(frozen=True, slots=True)
class _Kept:
    """One kept request as read back: its row keys, text hashes, vectors and tokens."""

    row_keys: list[str]
    text_hashes: list[str]
    vectors: np.ndarray
    tokens: int


class PaidRequests:
    """Vectors of requests already paid for, kept until the chunk publishes.

    One instance per chunk attempt; cheap to build (no I/O until a method needs it).
    ``run_key`` is the run's key (64 hex, docs/reference/keys.md), ``chunk_key`` the chunk's name
    (``chunk_name(spec.object_key)``). Not thread-safe: one chunk task uses it.
    """

    def __init__(self, store: ObjectStore, run_key: str, chunk_key: str) -> None:
        if not run_key or "/" in run_key or not chunk_key or "/" in chunk_key:
            raise ValueError("run_key and chunk_key must be non-empty names without '/'")
        self.store = store
        self.prefix = f"{PAID_PREFIX}{run_key}/{chunk_key}/"
        self._read: dict[str, _Kept] | None = None  # request object key -> kept, once listed
        self._marks: list[str] = []  # other keys under the prefix (gave-up marks), once listed
        self._written: dict[str, _Kept] = {}
        self._held: dict[str, _Kept] = {}  # paid for, in memory only: see keep(held=True)

    # -- write --------------------------------------------------------------------------

    def keep(
        self,
        row_keys: Sequence[str],
        vectors: np.ndarray,
        *,
        tokens: int,
        request_key: str,
        text_hashes: Sequence[str] | None = None,
        held: bool = False,
    ) -> None:
        """Keep one successful request: ``vectors`` float32 ``(len(row_keys), dims)``, row i
        for ``row_keys[i]``; ``tokens`` as the API reported them; ``request_key`` the
        request's Idempotency-Key (names the object, so a request kept twice is one object).
        ``text_hashes`` (``text_sha256`` per row) let other chunks of the run take the
        vectors by text (the in-run dedup handover); without them only this chunk can.

        Best effort: a store failure logs one warning and returns (the request may then be
        paid again), it never raises into the chunk.

        :raises ValueError: shapes disagree (a caller's bug, not a store failure).
        """
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        hashes = list(text_hashes) if text_hashes is not None else [""] * len(row_keys)
        if matrix.ndim != 2 or matrix.shape[0] != len(row_keys) or len(hashes) != len(row_keys):
            raise ValueError(
                f"keep(): {len(row_keys)} row keys, {len(hashes)} text hashes, "
                f"vectors of shape {matrix.shape}"
            )
        if not row_keys:
            return
        kept = _Kept(list(row_keys), hashes, matrix, int(tokens))
        if held:
            self._held[request_key] = kept
            return
        self._write(request_key, kept)

    @contextlib.contextmanager
    def keep_held_on_failure(self) -> Iterator[None]:
        """Around a chunk's embed-and-publish: if anything raises (a later request, the
        publish, a stop), write the held requests (``keep(held=True)``) before the error
        goes on, so the chunk's next attempt does not pay for them again."""
        try:
            yield
        except BaseException:
            held, self._held = self._held, {}
            for request, kept in held.items():
                self._write(request, kept)
            raise

    def _write(self, request: str, kept: _Kept) -> None:
        key = self._key(request)
        body = _encode(kept, request)
        try:
            self.store.put_if_absent(key, body, sha256=_sha256(body), content_type=_PARQUET)
        except (EmbedlineError, OSError) as exc:  # ConflictError: kept before, other bytes
            logger.warning(
                "could not keep a paid request under %s (it may be paid again): %s",
                self.prefix,
                type(exc).__name__,
            )
            return
        self._written[key] = kept

    # -- read ---------------------------------------------------------------------------

    def kept(self) -> dict[str, np.ndarray]:
        """``row_key -> vector`` (float32 ``(dims,)``) of every kept request of this chunk:
        those earlier attempts kept (listed once, then cached) and those kept since."""
        out: dict[str, np.ndarray] = {}
        for kept in self._all().values():
            out.update(zip(kept.row_keys, kept.vectors, strict=True))
        return out

    def kept_by_text(self) -> dict[str, np.ndarray]:
        """``text_sha256 -> vector`` of the kept rows whose text hash was kept (the in-run
        dedup handover: a chunk waiting on this one as owner takes its texts from here)."""
        out: dict[str, np.ndarray] = {}
        for kept in self._all().values():
            out.update((h, v) for h, v in zip(kept.text_hashes, kept.vectors, strict=True) if h)
        return out

    def tokens(self) -> int:
        """Tokens the API reported for the kept requests (so a summary counts what was paid)."""
        return sum(k.tokens for k in self._all().values())

    def requests(self) -> int:
        """How many kept requests there are (objects under this chunk's prefix)."""
        return len(self._all())

    # -- remove -------------------------------------------------------------------------

    def clear(self) -> None:
        """Delete every kept request of this chunk (after its object is published). Best
        effort: what cannot be deleted now is left to ``embedline gc``."""
        keys = set(self._written) | set(self._listed()) | set(self._marks)
        for key in sorted(keys):
            self.store.discard_scratch(key)
        self._read, self._written, self._marks, self._held = {}, {}, [], {}

    # -- internals ----------------------------------------------------------------------

    def _key(self, request: str) -> str:
        return f"{self.prefix}{request}.parquet"

    def _all(self) -> dict[str, _Kept]:
        held = {self._key(request): kept for request, kept in self._held.items()}
        return {**self._listed(), **self._written, **held}

    def _listed(self) -> dict[str, _Kept]:
        if self._read is not None:
            return self._read
        read: dict[str, _Kept] = {}
        try:
            listed = [i.key for i in self.store.list(self.prefix)]
        except (EmbedlineError, OSError) as exc:
            logger.warning(
                "could not list the paid requests under %s: %s", self.prefix, type(exc).__name__
            )
            listed = []
        keys = [k for k in listed if k.endswith(".parquet")]
        self._marks = [k for k in listed if not k.endswith(".parquet")]
        for key in keys:
            if key in self._written:
                continue
            try:
                read[key] = _decode(self.store.get(key))
            except FileNotFoundError:
                continue  # cleared meanwhile: its chunk was published
            except (EmbedlineError, OSError, ValueError, KeyError, pa.ArrowException) as exc:
                logger.warning(
                    "skipping an unreadable paid request %s: %s", key, type(exc).__name__
                )
        self._read = read
        return read


def keep_handed(
    paid: PaidRequests,
    rows: Sequence[Row],
    vectors: dict[int, np.ndarray],
    *,
    model: str,
    dimensions: int | None,
) -> None:
    """Keep, as this chunk's own, the vectors of ``rows`` it took from another chunk's kept
    requests (the in-run dedup handover): should this chunk fail too, a chunk after it
    takes them from here instead of paying for them again. 0 tokens (paid once, counted
    by the chunk that paid)."""
    if len({len(vectors[r.row_number]) for r in rows}) != 1:
        return  # of two lengths (the run's is not known yet): not kept, at worst paid again
    keys = [row_key(r.id, r.text_sha256, model, dimensions) for r in rows]
    paid.keep(
        keys,
        np.stack([vectors[r.row_number] for r in rows]),
        tokens=0,
        request_key=request_key(["handed over", *keys]),
        text_hashes=[r.text_sha256 for r in rows],
    )


def take_paid(
    paid: PaidRequests,
    rows: Sequence[Row],
    *,
    model: str,
    dimensions: int | None,
    length: int | None,
) -> dict[int, np.ndarray]:
    """Vectors (float32, by ``row_number``) of the ``rows`` a kept request of this chunk
    covers: matched by ``text_sha256`` (so a row whose text an earlier attempt sent for
    another row of the chunk is covered too), else by row key (``dimensions`` as requested).
    Empty texts are never covered. Only vectors ``length`` long are taken (the run's length;
    None: unknown yet, then the first kept vector's length decides).
    """
    if not rows:
        return {}
    by_key = paid.kept()
    if not by_key:
        return {}
    by_text = paid.kept_by_text()
    out: dict[int, np.ndarray] = {}
    for row in rows:
        if not row.text.strip():
            continue
        vector = by_text.get(row.text_sha256)
        if vector is None:
            vector = by_key.get(row_key(row.id, row.text_sha256, model, dimensions))
        if vector is None:
            continue
        if length is None:
            length = len(vector)
        if len(vector) == length:
            out[row.row_number] = vector
    return out


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _encode(kept: _Kept, request_key: str) -> bytes:
    dims = int(kept.vectors.shape[1])
    embedding = pa.FixedSizeListArray.from_arrays(
        pa.array(kept.vectors.reshape(-1), pa.float32()), dims
    )
    table = pa.table(
        {
            "row_key": pa.array(kept.row_keys, pa.string()),
            "text_sha256": pa.array(kept.text_hashes, pa.string()),
            "embedding": embedding,
        }
    )
    meta = {"tokens": kept.tokens, "request_key": request_key, "dimensions": dims}
    table = table.replace_schema_metadata({_META: json.dumps(meta).encode()})
    buf = io.BytesIO()
    # No dictionary encoding, no statistics: Parquet's defaults hashed every float of the
    # request into a dictionary that is then abandoned (30 ms a request of 1,000 x 384,
    # against 2.5 ms; 2 s of the CLI's 9 s of CPU for the English file).
    pq.write_table(table, buf, compression="none", use_dictionary=False, write_statistics=False)
    return buf.getvalue()


def _decode(body: bytes) -> _Kept:
    """:raises ValueError, KeyError, pa.ArrowException: not a kept request."""
    table = pq.read_table(io.BytesIO(body))
    meta = json.loads((table.schema.metadata or {})[_META])
    embedding = table["embedding"].combine_chunks()
    width = embedding.type.list_size
    flat = embedding.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return _Kept(
        table["row_key"].to_pylist(),
        table["text_sha256"].to_pylist(),
        flat.reshape(-1, width),
        int(meta["tokens"]),
    )
