"""Row-level reuse, the chunk task's side: take copied vectors, wait for in-run owners.

The flow process plans reuse for the whole run before dispatching (``tasks/reuse/row_sources.py``:
which rows an earlier object, or a request this run kept, already holds; which chunk of
this run embeds each other text) and copies the vectors once per source object into a file
per chunk (``tasks/reuse/gather.py``). A chunk task then:

- takes its copied vectors (``take_prefill``: the ``Prefill`` file its ``ReusePlan`` names,
  each row's full text hash checked against the copy);
- waits for the in-run owners of texts an earlier chunk embeds (``take_reused``: the
  ``text_sha256`` and ``embedding`` columns of the owner's object once it is published,
  matched by the full text hash). An owner chunk that fails hands over what it paid for:
  the waiting chunk takes the owner's kept requests (``tasks/embed/paid.py``, by text hash), and
  the texts it never got are embedded by the first chunk that waited for them (its
  *heirs*, in order), the others waiting for that one in turn. Anything it still cannot
  get (an object deleted by gc) is embedded instead: reuse never costs correctness, only,
  rarely, a second payment;
- deduplicates its own rows (``split_duplicates``) and assembles the chunk (``combine``).

No deadlock: a chunk only ever waits for chunks submitted before it (owners come first in
chunk order), each of which holds its own worker thread; a failed owner is reported to
waiting tasks of this process at once (``note_failed``), and to tasks elsewhere (Dask)
through a gave-up mark in the store (``tasks.embed.paid.mark_gave_up``, looked for every
second); a task that sees neither stops waiting after ``IN_RUN_WAIT_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from adapters.embeddings import estimate_tokens
from embedline.errors import BadResponseError, EmbedlineError
from embedline.keys import row_keys
from embedline.models import DeadLetter, ReusePlan, ReuseSource, Row
from embedline.protocols import ObjectStore
from tasks.embed.paid import PaidRequests, chunk_name, gave_up_key
from tasks.embed.rows import EmbeddedRows
from tasks.publish.chunk_object import read_chunk_metadata
from tasks.reuse.gather import Prefill

__all__ = [
    "IN_RUN_WAIT_S",
    "Reused",
    "combine",
    "drop_other_lengths",
    "forget_failures",
    "note_failed",
    "split_duplicates",
    "take_prefill",
    "take_reused",
]

logger = logging.getLogger("embedline")

#: Seconds a chunk task waits for another chunk of its run to publish a text it owns.
IN_RUN_WAIT_S = 600.0
_POLL_S = 0.2
_MARK_POLL_S = 1.0  # seconds between looks for an owner's gave-up mark (another process)
_failed_objects: set[str] = set()  # in-run owners that will not publish (this process)
_registry_lock = threading.Lock()  # guards _failed_objects


# --------------------------------------------------------------------------- chunk task


def note_failed(object_key: str) -> None:
    """Tell chunk tasks of this process that ``object_key`` will not appear in this run."""
    with _registry_lock:
        _failed_objects.add(object_key)


def forget_failures() -> None:
    """A new run in this process: owners that failed in earlier runs do not apply."""
    with _registry_lock:
        _failed_objects.clear()


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
        """Add the vectors of this chunk's kept requests (``tasks.embed.paid.take_paid``)."""
        self.vectors.update(vectors)
        self.paid.update(vectors)

    def merge(self, other: Reused) -> None:
        """Add what ``other`` found for rows this one has no vector for."""
        for number, vector in other.vectors.items():
            self.vectors.setdefault(number, vector)
        self.reused += other.reused
        self.deduplicated += other.deduplicated
        self.tokens_saved += other.tokens_saved
        self.in_run |= other.in_run
        self.paid |= other.paid
        self.handed |= other.handed


def take_prefill(rows: Sequence[Row], plan: ReusePlan) -> Reused:
    """The vectors the reuse stage copied for this chunk (``plan.prefill``, a ``Prefill``
    file of ``plan.width``-long vectors, or ``plan.copies``, its bytes), by row number, for rows
    whose full text hash
    matches the copy; counted as reused (from an earlier run, or from a request a failed
    attempt of this run kept for another chunk). Empty when the plan copied nothing.

    A file that is gone (the run's scratch directory deleted under it) copies nothing.
    """
    found = Reused({})
    if (plan.prefill is None and plan.copies is None) or plan.width is None:
        return found
    try:
        copied = Prefill(plan.width, path=plan.prefill, data=plan.copies)
    except FileNotFoundError:  # the run's scratch directory was deleted under it
        logger.warning(
            "the vectors copied for this chunk are gone (%s): sending its rows", plan.prefill
        )
        return found
    found.vectors = copied.take(list(rows))
    found.reused = len(found.vectors)
    by_number = {r.row_number: r for r in rows}
    found.tokens_saved = sum(estimate_tokens(by_number[n].text) for n in found.vectors)
    return found


def take_reused(
    store: ObjectStore,
    rows: Sequence[Row],
    plan: ReusePlan,
    *,
    model: str,
    wait_s: float = IN_RUN_WAIT_S,
    dimensions: int | None = None,
    run_key: str | None = None,
) -> Reused:
    """Wait for the in-run owners ``plan.sources`` name and read the planned rows' vectors
    from their objects; rows not found are left out, and so are rows of an object whose
    vectors are not ``dimensions`` long (the run's length, when known,
    docs/reference/failure-classes.md). All are counted as deduplicated.

    With ``run_key``, an in-run owner whose object does not come (it failed, or the wait
    ran out) hands over the requests it kept (``tasks/embed/paid.py``): its rows are taken from
    there by text hash.

    :raises RetryableError, FatalError: the store failed (not a missing object).
    """
    found = Reused({})
    handed: set[str] = set()  # text hashes served from a failed chunk's kept requests
    for source in plan.sources:
        picked = [rows[p] for p in source.rows]
        vectors = _vectors_for(
            store,
            source,
            [r.text_sha256 for r in picked],
            model,
            wait_s,
            dimensions,
            run_key,
            plan.session,
            handed,
        )
        for row, vector in zip(picked, vectors, strict=True):
            if vector is None:
                continue
            found.vectors[row.row_number] = vector
            if row.text_sha256 in handed:
                found.handed.add(row.row_number)
            found.tokens_saved += estimate_tokens(row.text)
            found.deduplicated += 1
            found.in_run.add(row.row_number)
    return found


def drop_other_lengths(found: Reused, rows: Sequence[Row], length: int) -> list[Row]:
    """Take out of ``found`` the vectors that are not ``length`` long and return their rows
    (to be sent): the run learned its length from the server after they were read."""
    stale = [
        r
        for r in rows
        if r.row_number in found.vectors and len(found.vectors[r.row_number]) != length
    ]
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
    deadline = time.monotonic() + wait_s
    mark = (
        gave_up_key(run_key, chunk_name(source.object_key), session)
        if run_key and session
        else None
    )
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
            if (
                now >= deadline
                or _gave_up(source.object_key)
                or (look and mark is not None and _marked(store, mark))
            ):
                return _handed_over(
                    store, source, hashes, model, wait_s, dimensions, run_key, session, handed
                )
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
    store: ObjectStore,
    source: ReuseSource,
    hashes: list[str],
    model: str,
    wait_s: float,
    dimensions: int | None,
    run_key: str | None,
    session: str,
    handed: set[str] | None = None,
) -> list[np.ndarray | None]:
    """The vectors an in-run owner that will not publish kept of ``hashes``, then those its
    heirs (``ReuseSource.heirs``, in turn) publish or kept; None where none has one. So
    what was paid for is not paid again, and the owner's other texts by one chunk only."""
    if not run_key:
        return [None] * len(hashes)
    kept = PaidRequests(store, run_key, chunk_name(source.object_key)).kept_by_text()
    vectors = [
        v if v is not None and (dimensions is None or len(v) == dimensions) else None
        for v in (kept.get(h) for h in hashes)
    ]
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
            heir = ReuseSource(heir_key, ())
            got = _vectors_for(
                store,
                heir,
                [hashes[i] for i in at],
                model,
                wait_s,
                dimensions,
                run_key,
                session,
                handed,
            )
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
            dead[row.row_number] = DeadLetter(
                row.row_number, row.id, reason.reason, reason.http_status, reason.attempts
            )
    kept = [r for r in rows if r.row_number in vectors]
    width = (
        embedded.vectors.shape[1]
        if embedded.rows
        else (len(next(iter(vectors.values()))) if vectors else (dimensions or 0))
    )
    if any(len(vectors[r.row_number]) != width for r in kept):
        raise BadResponseError("reused vectors differ in length from the embedded ones")
    stacked = (
        np.ascontiguousarray(np.stack([vectors[r.row_number] for r in kept]), dtype=np.float32)
        if kept
        else np.zeros((0, width), dtype=np.float32)
    )
    return EmbeddedRows(
        rows=kept,
        vectors=stacked,
        row_keys=row_keys((r.id for r in kept), (r.text_sha256 for r in kept), model, dimensions),
        dead_letters=sorted(dead.values(), key=lambda d: d.row_number),
        tokens=embedded.tokens,
        requests=embedded.requests,
    )
