"""Row-level reuse: pay once per distinct text, model and dimensions under an output root.

Where each step runs, and why (DESIGN §8):

- ``refresh_index`` (flow process, before dispatch): lists ``chunks/`` and adds every object
  the ledger's reuse index does not cover yet (only its ``id``, ``text_sha256`` and
  ``idempotency_key`` columns are read: ranged reads on S3), and drops objects that are gone.
  So the index is a cache of the store: a fresh ledger or a new machine rebuilds it.
- ``ReusePlanner.resolve`` (flow process, when a chunk is submitted): reads the chunk's rows
  and decides, per non-empty text, where its vector comes from: an indexed object of an
  earlier run, or the chunk of *this* run that embeds that text first (each distinct text is
  owned by the first chunk resolved with it). The result is a small ``ReusePlan`` (object
  keys and row positions), so tasks on Dask workers need no ledger.
- ``take_reused`` (chunk task): reads the vectors of the planned rows, object by object (the
  ``text_sha256`` and ``embedding`` columns only), matching by the full text hash, and
  waits for objects of this run still being published. An owner chunk that fails hands
  over what it paid for: the waiting chunk takes the owner's kept requests
  (``tasks/paid.py``, matched by text hash), and a chunk planned after the owner failed is
  pointed at them too (``ReuseSource.owner_failed``: no wait). Anything it still cannot get
  (an object deleted by gc, texts the owner never got to) is embedded instead: reuse never
  costs correctness, only, rarely, a second payment.

No deadlock: a chunk only ever waits for chunks submitted before it (owners are resolved
first), each of which holds its own worker thread; a failed owner is reported to waiting
tasks of this process at once (``note_failed``), and to tasks elsewhere (Dask) through a
gave-up mark in the store (``tasks.paid.mark_gave_up``, looked for every second); a task
that sees neither stops waiting after ``IN_RUN_WAIT_S``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from adapters.csv_source import read_chunk
from adapters.embeddings import estimate_tokens
from adapters.ledger import Ledger
from embedline.errors import BadResponseError, EmbedlineError
from embedline.keys import dims_text, row_key
from embedline.models import (
    ChunkSpec,
    DeadLetter,
    InputSource,
    ReusePlan,
    ReuseSource,
    Row,
    chunk_object_key,
)
from embedline.protocols import ObjectStore
from tasks.embed import EmbeddedRows
from tasks.paid import PaidRequests, chunk_name, gave_up_key, kept_texts, mark_gave_up
from tasks.publish import read_chunk_metadata

__all__ = [
    "IN_RUN_WAIT_S",
    "ReusePlanner",
    "Reused",
    "chunk_rows",
    "note_failed",
    "combine",
    "drop_other_lengths",
    "refresh_index",
    "split_duplicates",
    "take_reused",
]

#: Seconds a chunk task waits for another chunk of its run to publish a text it owns.
IN_RUN_WAIT_S = 600.0
_POLL_S = 0.2
_MARK_POLL_S = 1.0  # seconds between looks for an owner's gave-up mark (another process)
_HEIRS = 16  # waiters remembered per text, in order, to take over from a failed owner
_INDEX_THREADS = 16
_failed_objects: set[str] = set()  # in-run owners that will not publish (this process)
_registry_lock = threading.Lock()  # guards _failed_objects and _read_ahead
_read_ahead: dict[tuple[str, int, str], list[Row]] = {}  # rows resolve read, for the task

# --------------------------------------------------------------------------- flow process


def refresh_index(store: ObjectStore, ledger: Ledger) -> int:
    """Bring the ledger's reuse index for ``store`` in line with its ``chunks/``.

    Returns the number of objects newly indexed. Objects that are not embedline chunks are
    skipped (never indexed, never touched).
    """
    listed = {i.key for i in store.list("chunks/") if i.key.endswith(".parquet")}
    known = ledger.indexed_objects(store.uri)
    ledger.forget_objects(store.uri, sorted(known - listed))
    todo = sorted(listed - known)
    with ThreadPoolExecutor(_INDEX_THREADS) as pool:
        for key, entry in zip(todo, pool.map(lambda k: _index_entry(store, k), todo),
                              strict=True):
            if entry is not None:
                model, dims, hashes = entry
                ledger.index_object(store.uri, key, model=model, dimensions=dims,
                                    text_hashes=hashes)
    return len(todo)


def _index_entry(store: ObjectStore, key: str) -> tuple[str, str, list[str]] | None:
    """(model, requested dimensions text, text hashes) of a chunk object, or None."""
    try:
        with store.open_read(key) as fh:
            parquet = pq.ParquetFile(fh)
            meta = read_chunk_metadata(parquet.schema_arrow)
            table = parquet.read(columns=["id", "text_sha256", "idempotency_key"])
    except (FileNotFoundError, ValueError, pa.ArrowException):
        return None
    if table.num_rows == 0:
        return meta.model, "", []
    first = table.slice(0, 1).to_pylist()[0]
    # The row key holds the *requested* dimensions ("" when unset): recover which one.
    for requested in (None, meta.dimensions):
        if row_key(first["id"], first["text_sha256"], meta.model, requested) == \
                first["idempotency_key"]:
            return meta.model, dims_text(requested), table["text_sha256"].to_pylist()
    return None


class ReusePlanner:
    """Decides, chunk by chunk, which rows need no request (see the module docstring).

    Memory: one entry per distinct text of the run (its first 64 bits as an int → owner
    chunk), about 90 bytes each. A 64-bit collision only makes a task look for a text in
    an object that lacks it, and embed it.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        store: ObjectStore,
        source: InputSource,
        model: str,
        dimensions: int | None,
        reuse: bool,
        run_key: str = "",
    ) -> None:
        self._ledger, self._store, self._source = ledger, store, source
        self._run_key, self._session = run_key, secrets.token_hex(8)
        self._model, self._dims, self._reuse = model, dims_text(dimensions), reuse
        self._owner: dict[int, int] = {}
        self._object_of: dict[int, str] = {}
        self._failed: set[int] = set()
        # the first chunks that wait for a text's owner (at most _HEIRS): the first of them
        # still running owns the text if the owner fails
        self._heirs: dict[int, list[int]] = {}
        # texts kept by chunks of this run that failed in an earlier process: chunk name
        self._kept: dict[int, str] = {
            int(h[:16], 16): name for h, name in kept_texts(store, run_key).items()
        } if run_key else {}
        with _registry_lock:
            _failed_objects.clear()  # a new run: earlier runs' failures do not apply
            _read_ahead.clear()

    def resolve(self, spec: ChunkSpec) -> ReusePlan:
        """Return the chunk's reuse plan and make it the owner of its new texts.

        An input that cannot be read gives an empty plan: the task reports the error.
        """
        try:
            rows = read_chunk(self._source, spec)
        except EmbedlineError:
            return ReusePlan()
        with _registry_lock:
            _read_ahead[_read_ahead_key(self._source, spec)] = rows
        wanted = [r for r in rows if r.text.strip()]
        stored = self._ledger.find_vectors(
            self._store.uri, model=self._model, dimensions=self._dims,
            text_hashes=[r.text_sha256 for r in wanted],
        ) if self._reuse else {}
        by_object: dict[tuple[str, bool, bool], list[tuple[int, tuple[str, ...]]]] = \
            defaultdict(list)
        self._object_of[spec.index] = spec.object_key
        name = chunk_name(spec.object_key)
        for position, row in enumerate(rows):
            if not row.text.strip():
                continue
            if row.text_sha256 in stored:
                by_object[(stored[row.text_sha256], False, False)].append((position, ()))
                continue
            short = int(row.text_sha256[:16], 16)
            kept_by = self._kept.get(short)
            if kept_by is not None:  # paid for by a chunk that failed before this process
                if kept_by != name:  # (its own: the task takes it, tasks.paid.take_paid)
                    by_object[(chunk_object_key(kept_by), True, True)].append((position, ()))
                continue
            owner = self._owner.get(short)
            if owner is None or owner in self._failed:
                self._owner[short] = spec.index
                if owner is not None:  # it may have paid for the text before it failed
                    by_object[(self._object_of[owner], True, True)].append((position, ()))
            elif owner != spec.index:
                heirs = self._heirs.setdefault(short, [])
                before = heirs[:heirs.index(spec.index)] if spec.index in heirs else list(heirs)
                if spec.index not in heirs and len(heirs) < _HEIRS:
                    heirs.append(spec.index)
                after = tuple(self._object_of[h] for h in before
                              if h != owner and h not in self._failed)
                by_object[(self._object_of[owner], True, False)].append((position, after))
        return ReusePlan(tuple(_source(key, in_run, failed, picked)
                               for (key, in_run, failed), picked in by_object.items()),
                         session=self._session)

    def note_failed(self, index: int) -> None:
        """Chunk ``index`` will not publish in this run: its texts go to later chunks."""
        self._failed.add(index)
        for short, heirs in self._heirs.items():  # its first live waiter embeds its texts
            if self._owner.get(short) == index:
                live = [h for h in heirs if h not in self._failed]
                if live:
                    self._owner[short] = live[0]
        object_key = self._object_of.get(index, "")
        note_failed(object_key)
        if object_key and self._run_key:  # for chunks waiting on it in other processes
            mark_gave_up(self._store, self._run_key, chunk_name(object_key), self._session)


def _source(key: str, in_run: bool, failed: bool,
            picked: list[tuple[int, tuple[str, ...]]]) -> ReuseSource:
    chains = tuple(chain for _, chain in picked)
    return ReuseSource(key, tuple(p for p, _ in picked), in_run, failed,
                       chains if any(chains) else ())


# --------------------------------------------------------------------------- chunk task


def note_failed(object_key: str) -> None:
    """Tell chunk tasks of this process that ``object_key`` will not appear in this run."""
    with _registry_lock:
        _failed_objects.add(object_key)


def chunk_rows(source: InputSource, spec: ChunkSpec) -> list[Row]:
    """The chunk's rows: those ``ReusePlanner.resolve`` read in this process (taken once:
    the dispatcher thread parsed them already, so the task does not parse them again), else
    ``read_chunk`` (a Dask worker, a Prefect retry of the task).

    :raises InputError: as ``read_chunk``.
    """
    with _registry_lock:
        rows = _read_ahead.pop(_read_ahead_key(source, spec), None)
    return rows if rows is not None else read_chunk(source, spec)


def _read_ahead_key(source: InputSource, spec: ChunkSpec) -> tuple[str, int, str]:
    return source.path, spec.index, spec.bytes_sha256


def _gave_up(object_key: str) -> bool:
    with _registry_lock:
        return object_key in _failed_objects


@dataclass(slots=True)
class Reused:
    """Vectors found for a chunk's rows: ``vectors`` by row number (float32 arrays)."""

    vectors: dict[int, np.ndarray]
    reused: int = 0
    deduplicated: int = 0
    tokens_saved: int = 0
    in_run: set[int] = field(default_factory=set)  # row numbers copied from this run's objects
    paid: set[int] = field(default_factory=set)  # row numbers an earlier attempt paid for
    handed: set[int] = field(default_factory=set)  # taken from another chunk's kept requests

    def take_paid(self, vectors: dict[int, np.ndarray]) -> None:
        """Add the vectors of this chunk's kept requests (``tasks.paid.take_paid``)."""
        self.vectors.update(vectors)
        self.paid.update(vectors)


def take_reused(
    store: ObjectStore, rows: Sequence[Row], plan: ReusePlan, *, model: str,
    wait_s: float = IN_RUN_WAIT_S, dimensions: int | None = None, run_key: str | None = None,
) -> Reused:
    """Read the planned rows' vectors from their objects; rows not found are left out, and
    so are rows of an object whose vectors are not ``dimensions`` long (the run's length,
    when known: an older object of another length is a stale cache, DESIGN §5).

    With ``run_key``, an in-run owner whose object does not come (it failed, or the wait
    ran out) hands over the requests it kept (``tasks/paid.py``): its rows are taken from
    there by text hash.

    :raises RetryableError, FatalError: the store failed (not a missing object).
    """
    found = Reused({})
    handed: set[str] = set()  # text hashes served from a failed chunk's kept requests
    for source in plan.sources:
        picked = [rows[p] for p in source.rows]
        vectors = _vectors_for(store, source, [r.text_sha256 for r in picked], model, wait_s,
                               dimensions, run_key, plan.session, handed)
        for row, vector in zip(picked, vectors, strict=True):
            if vector is None:
                continue
            found.vectors[row.row_number] = vector
            if row.text_sha256 in handed:
                found.handed.add(row.row_number)
            found.tokens_saved += estimate_tokens(row.text)
            if source.in_run:
                found.deduplicated += 1
                found.in_run.add(row.row_number)
            else:
                found.reused += 1
    return found


def drop_other_lengths(found: Reused, rows: Sequence[Row], length: int) -> list[Row]:
    """Take out of ``found`` the vectors that are not ``length`` long and return their rows
    (to be sent): the run learned its length from the server after they were read."""
    stale = [r for r in rows
             if r.row_number in found.vectors and len(found.vectors[r.row_number]) != length]
    for row in stale:
        del found.vectors[row.row_number]
        if row.row_number in found.paid:
            found.paid.discard(row.row_number)
            continue
        found.tokens_saved -= estimate_tokens(row.text)
        if row.row_number in found.in_run:
            found.deduplicated -= 1
        else:
            found.reused -= 1
    return stale


def _vectors_for(
    store: ObjectStore,
    source: ReuseSource,
    hashes: list[str],
    model: str,
    wait_s: float,
    dimensions: int | None = None,
    run_key: str | None = None,
    session: str = "",
    handed: set[str] | None = None,
) -> list[np.ndarray | None]:
    waits = source.in_run and not source.owner_failed
    deadline = time.monotonic() + (wait_s if waits else 0.0)
    mark = (gave_up_key(run_key, chunk_name(source.object_key), session)
            if waits and run_key and session else None)
    looked = time.monotonic()
    while True:
        try:
            with store.open_read(source.object_key) as fh:
                parquet = pq.ParquetFile(fh)
                if read_chunk_metadata(parquet.schema_arrow).model != model:
                    return [None] * len(hashes)
                table = parquet.read(columns=["text_sha256", "embedding"])
            break
        except FileNotFoundError:
            now = time.monotonic()
            look = mark is not None and now - looked >= _MARK_POLL_S
            if look:
                looked = now
            if now >= deadline or _gave_up(source.object_key) or (
                    look and mark is not None and _marked(store, mark)):
                return _handed_over(store, source, hashes, model, wait_s, dimensions, run_key,
                                    session, handed)
            time.sleep(_POLL_S)
        except (ValueError, pa.ArrowException):
            return [None] * len(hashes)
    where = pc.index_in(pa.array(hashes, pa.string()), value_set=table["text_sha256"])
    embedding = table["embedding"].combine_chunks()
    width = embedding.type.list_size
    if dimensions is not None and width != dimensions:
        return [None] * len(hashes)  # an object of another length: send these rows
    flat = embedding.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
    return [None if i is None else flat[i].astype(np.float32) for i in where.to_pylist()]


def _marked(store: ObjectStore, key: str) -> bool:
    """Whether the owner's gave-up mark exists (a store error: not known, keep waiting)."""
    try:
        return store.head_sha256(key) is not None
    except EmbedlineError:
        return False


def _handed_over(
    store: ObjectStore, source: ReuseSource, hashes: list[str], model: str, wait_s: float,
    dimensions: int | None, run_key: str | None, session: str,
    handed: set[str] | None = None,
) -> list[np.ndarray | None]:
    """The vectors an in-run owner that will not publish kept of ``hashes``, then those its
    heirs (``ReuseSource.heirs``, in turn) publish or kept; None where none has one. So
    what was paid for is not paid again, and the owner's other texts by one chunk only."""
    if not source.in_run or not run_key:
        return [None] * len(hashes)
    kept = PaidRequests(store, run_key, chunk_name(source.object_key)).kept_by_text()
    vectors = [v if v is not None and (dimensions is None or len(v) == dimensions) else None
               for v in (kept.get(h) for h in hashes)]
    if handed is not None:
        handed.update(h for h, v in zip(hashes, vectors, strict=True) if v is not None)
    chains = source.heirs or ((),) * len(hashes)
    pending = [i for i, v in enumerate(vectors) if v is None and chains[i]]
    depth = 0
    while pending:  # the first waiter embeds them: wait for it, do not pay again
        by_heir: dict[str, list[int]] = defaultdict(list)
        for i in pending:
            by_heir[chains[i][depth]].append(i)
        for heir_key, at in by_heir.items():
            heir = ReuseSource(heir_key, (), in_run=True)
            got = _vectors_for(store, heir, [hashes[i] for i in at], model, wait_s,
                               dimensions, run_key, session, handed)
            for i, vector in zip(at, got, strict=True):
                vectors[i] = vector
        depth += 1
        pending = [i for i in pending if vectors[i] is None and depth < len(chains[i])]
    return vectors


def split_duplicates(rows: Sequence[Row]) -> tuple[list[Row], list[tuple[Row, Row]]]:
    """Return (rows to send, ``(row, earlier row with the same text)`` pairs).

    Empty texts are all kept (each becomes its own ``empty_text`` dead letter).
    """
    first: dict[str, Row] = {}
    send: list[Row] = []
    copies: list[tuple[Row, Row]] = []
    for row in rows:
        earlier = first.get(row.text_sha256) if row.text.strip() else None
        if earlier is None:
            first.setdefault(row.text_sha256, row)
            send.append(row)
        else:
            copies.append((row, earlier))
    return send, copies


def combine(
    rows: Sequence[Row],
    embedded: EmbeddedRows,
    found: Reused,
    copies: Sequence[tuple[Row, Row]],
    *,
    model: str,
    dimensions: int | None,
) -> EmbeddedRows:
    """The whole chunk in input order: embedded, reused and copied vectors together.

    A copy of a dead-lettered row is a dead letter with the same reason. Counts copies in
    ``found.deduplicated`` and ``found.tokens_saved``.
    """
    vectors = dict(found.vectors)
    vectors.update(zip((r.row_number for r in embedded.rows), embedded.vectors, strict=True))
    dead = {d.row_number: d for d in embedded.dead_letters}
    for row, earlier in copies:
        if earlier.row_number in vectors:
            vectors[row.row_number] = vectors[earlier.row_number]
            found.deduplicated += 1
            found.tokens_saved += estimate_tokens(row.text)
        elif earlier.row_number in dead:
            reason = dead[earlier.row_number]
            dead[row.row_number] = DeadLetter(row.row_number, row.id, reason.reason,
                                              reason.http_status, reason.attempts)
    kept = [r for r in rows if r.row_number in vectors]
    width = embedded.vectors.shape[1] if embedded.rows else (
        len(next(iter(vectors.values()))) if vectors else (dimensions or 0))
    if any(len(vectors[r.row_number]) != width for r in kept):
        raise BadResponseError("reused vectors differ in length from the embedded ones")
    stacked = (np.ascontiguousarray(np.stack([vectors[r.row_number] for r in kept]),
                                    dtype=np.float32)
               if kept else np.zeros((0, width), dtype=np.float32))
    return EmbeddedRows(
        rows=kept, vectors=stacked,
        row_keys=[row_key(r.id, r.text_sha256, model, dimensions) for r in kept],
        dead_letters=sorted(dead.values(), key=lambda d: d.row_number),
        tokens=embedded.tokens, requests=embedded.requests,
    )
