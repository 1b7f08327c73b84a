"""Chunk leases: one copy of a chunk task sends requests at a time (a Dask cluster only).

Dask runs a task again elsewhere when it gives up on the worker running it (killed, paused,
partitioned), and the first copy may still be running. Before a chunk task on Dask reads
what earlier attempts kept or sends anything, it takes the chunk's lease in the output
store (docs/reference/output-layout.md, "Leases")::

    _embedline/paid/{run_key}/{chunk_name}.lease/{epoch:06d}.{generation:06d}.json

Objects are create-only (``put_if_absent``): the copy that creates epoch ``E`` first holds
the chunk; a thread renews it every ``renew_s`` by writing generation ``g+1`` and deleting
``g``; the holder deletes its last generation when it ends, whatever the outcome. Another
copy finds the newest epoch and waits, polling every ``POLL_S``, until the chunk object is
published (it then adopts the object: nothing sent) or the lease is free: none left, or
its holder gone (a process of this host that no longer exists) or silent past
``ttl_s`` + ``skew_s`` by the store's clock (``lease_stale``'s rule, with a margin fit for
seconds-long TTLs); it then creates epoch ``E+1``. Of two copies that try, one creates
it, the other gets ``ConflictError`` and waits again.

The holder fences itself by its own monotonic clock: before each request and before
publishing (``check``), if ``ttl_s`` passed since its last successful write began (it was
paused, cut off from the network, or the store refused the renewals), it stops as holder
(``ChunkLeaseLost``) unless it can take the next epoch itself and the chunk is not
published. "Before each request" is every attempt, right before it goes out (the
embedding client calls ``check`` as ``before_send``, ``tasks.embed.spent.fenced``): a
retry's backoff or a connection that hangs while the network is cut can outlast the lease.
So a copy that wakes up or comes back after another took over sends nothing more; at most
the request it had on the wire when it stopped is paid twice.

Body: ``run_key``, ``chunk``, ``epoch``, ``ttl_s``, ``renew_s``, ``skew_s``, ``holder``
(``host``: ``host_tag()``, ``pid``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from embedline.errors import ConflictError, EmbedlineError
from embedline.protocols import ObjectStore
from tasks.embed.paid import PAID_PREFIX
from tasks.lease.held import holder_gone, host_tag

__all__ = [
    "CHUNK_LEASE_TTL_S",
    "ChunkLease",
    "ChunkLeaseLost",
    "chunk_lease_held",
    "chunk_lease_prefix",
    "chunk_lease_ttl",
    "take_chunk_lease",
]

#: How long a chunk lease holds without renewal (seconds); ``EMBEDLINE_CHUNK_LEASE_TTL_S``
#: on a worker sets another (``chunk_lease_ttl``).
CHUNK_LEASE_TTL_S = 60.0
#: How often a copy waiting for a chunk's lease looks again (seconds).
POLL_S = 1.0


class ChunkLeaseLost(EmbedlineError):
    """Raised inside a chunk task whose lease lapsed and went to another copy: it sends
    nothing more and waits for the chunk as any other copy does."""


def chunk_lease_ttl() -> float:
    """The chunk lease TTL (seconds): ``EMBEDLINE_CHUNK_LEASE_TTL_S`` if set, else
    ``CHUNK_LEASE_TTL_S``. Read on each chunk, in the worker's environment."""
    raw = os.environ.get("EMBEDLINE_CHUNK_LEASE_TTL_S", "")
    try:
        value = float(raw) if raw else CHUNK_LEASE_TTL_S
    except ValueError:
        return CHUNK_LEASE_TTL_S
    return value if value > 0 else CHUNK_LEASE_TTL_S


def chunk_lease_prefix(run_key: str, chunk: str) -> str:
    """The prefix of chunk ``chunk``'s lease objects (module docstring)."""
    return f"{PAID_PREFIX}{run_key}/{chunk}.lease/"


def _name(epoch: int, generation: int) -> str:
    return f"{epoch:06d}.{generation:06d}.json"


def _parse(name: str) -> tuple[int, int] | None:
    parts = name.split(".")
    if len(parts) != 3 or parts[2] != "json" or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


class ChunkLease:
    """A held chunk lease (``take_chunk_lease``): renewed by a daemon thread until
    ``release``; ``check`` fences the holder (module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        run_key: str,
        chunk: str,
        epoch: int,
        *,
        ttl_s: float,
        published: Callable[[], bool],
        log: Any = None,
    ) -> None:
        self.store, self.run_key, self.chunk, self.epoch = store, run_key, chunk, epoch
        self.ttl_s, self.renew_s, self.skew_s = ttl_s, ttl_s / 3, _skew(ttl_s)
        self.prefix = chunk_lease_prefix(run_key, chunk)
        self._published = published
        self._log = log
        self._generation = 0
        self._lock = threading.Lock()
        self._since = time.monotonic()  # when the last successful write began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        """The current generation's key."""
        return f"{self.prefix}{_name(self.epoch, self._generation)}"

    def body(self) -> bytes:
        """This holder's lease body."""
        record = {
            "run_key": self.run_key,
            "chunk": self.chunk,
            "epoch": self.epoch,
            "ttl_s": self.ttl_s,
            "renew_s": self.renew_s,
            "skew_s": self.skew_s,
            "holder": {"host": host_tag(), "pid": os.getpid()},
        }
        return json.dumps(record).encode()

    def create(self) -> bool:
        """Create this epoch's first generation; False if another copy did first."""
        began = time.monotonic()
        if not _create(self.store, self.key, self.body()):
            return False
        self._since = began
        return True

    def start(self) -> ChunkLease:
        """Start renewing; returns self."""
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"chunk-lease-{self.chunk[:12]}", daemon=True
        )
        self._thread.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            with self._lock:
                self._renew()

    def _renew(self) -> None:
        began = time.monotonic()
        if began - self._since >= self.ttl_s:
            return  # lapsed (paused, or the store refused): only ``check`` may take it back
        old = self.key
        self._generation += 1
        try:
            _create(self.store, self.key, self.body())
        except (EmbedlineError, OSError) as exc:
            self._generation -= 1
            if self._log is not None:
                self._log.warning("could not renew the chunk lease %s: %s", old, exc)
            return
        self._since = began
        _delete(self.store, old)

    def check(self) -> None:
        """Before a request or the publish: go on only while the lease holds by this
        process's clock, or after taking the next epoch itself (no one else did and the
        chunk is not published).

        :raises ChunkLeaseLost: another copy holds the chunk, or published it.
        """
        with self._lock:
            if time.monotonic() - self._since < self.ttl_s:
                return
            epochs = [p[0] for p in _listed(self.store, self.prefix)]
            if max(epochs, default=self.epoch) > self.epoch:
                raise ChunkLeaseLost(f"chunk lease {self.chunk}: another copy took it")
            old, self.epoch, self._generation = self.key, self.epoch + 1, 0
            if not self.create():
                raise ChunkLeaseLost(f"chunk lease {self.chunk}: another copy took it")
            _delete(self.store, old)
            if self._published():
                raise ChunkLeaseLost(f"chunk {self.chunk}: published by another copy")

    def release(self) -> None:
        """Stop renewing and delete the current generation (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            _delete(self.store, self.key)


def take_chunk_lease(
    store: ObjectStore,
    run_key: str,
    chunk: str,
    *,
    published: Callable[[], bool],
    ttl_s: float | None = None,
    log: Any = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ChunkLease | None:
    """Take chunk ``chunk``'s lease, waiting while another copy holds it; None once the
    chunk is published (``published()``: its object exists), to adopt it. The lease is
    renewed from now on: ``release`` it.

    :raises EmbedlineError: the store refused to list or write (the chunk fails as any
        store failure does).
    """
    ttl = ttl_s if ttl_s is not None else chunk_lease_ttl()
    prefix = chunk_lease_prefix(run_key, chunk)
    said = False
    while True:
        if published():
            return None
        listed = _listed(store, prefix)
        epoch = max((p[0] for p in listed), default=-1)
        newest = [(g, modified) for (e, g), modified in listed.items() if e == epoch]
        if newest:
            generation, modified = max(newest)
            if not _free(store, f"{prefix}{_name(epoch, generation)}", modified):
                if not said and log is not None:
                    log.info("chunk %s: another copy of this chunk is running; waiting", chunk)
                    said = True
                sleep(POLL_S)
                continue
        lease = ChunkLease(
            store, run_key, chunk, epoch + 1, ttl_s=ttl, published=published, log=log
        )
        if lease.create():
            for e, g in listed:  # the holders before: gone, or stale past their TTL
                _delete(store, f"{prefix}{_name(e, g)}")
            if published():  # the copy before published and released meanwhile
                _delete(store, lease.key)
                return None
            return lease.start()


def chunk_lease_held(store: ObjectStore, run_key: str, chunk: str) -> bool:
    """Whether a copy of chunk ``chunk`` holds its lease now: the newest generation of its
    newest epoch exists and is not free by ``take_chunk_lease``'s rule (its holder not
    known to be gone, nor silent past its TTL and slack by the store's clock).

    :raises EmbedlineError: the store refused to list.
    """
    prefix = chunk_lease_prefix(run_key, chunk)
    listed = _listed(store, prefix)
    if not listed:
        return False
    (epoch, generation), modified = max(listed.items())
    return not _free(store, f"{prefix}{_name(epoch, generation)}", modified)


def _skew(ttl_s: float) -> float:
    """Slack added to a chunk lease's TTL before another copy takes it over (seconds): the
    store's clock has whole seconds (S3) and a renewal may be slow; at most a minute."""
    return min(60.0, max(2.0, ttl_s / 2))


def _free(store: ObjectStore, key: str, modified: float) -> bool:
    """Whether the lease generation ``key`` (stamped ``modified`` by the store) no longer
    holds: its holder is a process of this host that is gone, or it is older than its TTL
    plus slack by the store's clock. A body that cannot be read holds for the default TTL."""
    try:
        record = json.loads(store.get(key))
    except FileNotFoundError:
        return True  # released meanwhile
    except (ValueError, EmbedlineError, OSError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    if holder_gone(record):
        return True
    try:
        ttl = float(record.get("ttl_s") or CHUNK_LEASE_TTL_S)
        skew = float(record.get("skew_s") or _skew(ttl))
    except (TypeError, ValueError):
        ttl, skew = CHUNK_LEASE_TTL_S, _skew(CHUNK_LEASE_TTL_S)
    return store.server_now() - modified > ttl + skew


def _listed(store: ObjectStore, prefix: str) -> dict[tuple[int, int], float]:
    """``(epoch, generation) -> modified`` of the lease objects under ``prefix``."""
    out: dict[tuple[int, int], float] = {}
    for info in store.list(prefix):
        parsed = _parse(info.key[len(prefix) :])
        if parsed is not None:
            out[parsed] = info.modified
    return out


def _create(store: ObjectStore, key: str, body: bytes) -> bool:
    try:
        put = store.put_if_absent(
            key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="application/json"
        )
    except ConflictError:
        return False
    return put.created


def _delete(store: ObjectStore, key: str) -> None:
    with contextlib.suppress(EmbedlineError, OSError):  # left to embedline gc
        store.discard_scratch(key)
