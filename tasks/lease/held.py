"""Leases: objects in the output store that tell gc what a run or a load in progress needs
(docs/reference/output-layout.md, "Leases"). One helper, ``held_lease``, for both kinds.

A lease is written before its holder reads or writes anything gc could delete, and deleted
when it ends, whatever the outcome. Key::

    _embedline/runs/{run_key}.{owner}.{generation:06d}.json    a run   (``run_lease.py``)
    _embedline/loads/{run_key}.{owner}.{generation:06d}.json   a load  (``load_lease.py``)

``owner`` is 16 hex of the holder's SHA-256 (no host names in keys). Body: ``run_key``,
``started_at`` (Unix s), ``objects`` (the keys gc must keep), ``ttl_s`` (``LEASE_TTL_S``),
``renew_s`` (``LEASE_RENEW_S``), ``expires_at`` (Unix s, the holder's clock: for people; no
one judges by it), ``holder`` (``host``: 16 hex of a SHA-256 of the host name and its pid
namespace, never the name; ``pid``), and the holder's ``facts`` (a run's model and
dimensions: ``tasks/lease/overlap.py``). Objects are
create-only (``put_if_absent``), so a lease is renewed by writing the next generation and
deleting the one before; a thread renews it every ``LEASE_RENEW_S`` (a monotonic timer) while
the holder runs, so a lease is live (gc keeps what it lists) for as long as its holder runs,
whatever gc's ``--grace``.

A lease's age is judged by one clock, the store's (``lease_stale``): its ``LastModified``
(a file's mtime) against the store's now (``ObjectStore.server_now``). It is stale only once
that age exceeds ``ttl_s`` + ``LEASE_SKEW_MARGIN_S`` and the grace period, so a lease renewed
within its TTL is never taken for stale, whatever the clock of the host that judges it. A
holder killed without its ``finally`` (``kill -9``, a machine lost) leaves a lease that
protects for at most ``ttl_s`` + the margin more, then until it is older than gc's grace
period, when gc deletes it as stale.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from adapters.ledger import new_owner
from adapters.object_store import SCRATCH_PREFIX
from adapters.processes import local_process_is_gone
from embedline.errors import EmbedlineError
from embedline.protocols import ObjectStore

__all__ = [
    "LEASE_PREFIX",
    "LEASE_PREFIXES",
    "LEASE_RENEW_S",
    "LEASE_SKEW_MARGIN_S",
    "LEASE_TTL_S",
    "LOAD_LEASE_PREFIX",
    "drop_lease",
    "held_lease",
    "holder_gone",
    "host_tag",
    "lease_stale",
    "lease_ttl",
    "owner_tag",
    "write_lease",
]

#: Leases of runs (embed and publish, commit, the load after it with ``--sink``).
LEASE_PREFIX = f"{SCRATCH_PREFIX}runs/"
#: Leases of loads into a sink (``embedline load``, ``run --sink``, flow ``load-run``).
LOAD_LEASE_PREFIX = f"{SCRATCH_PREFIX}loads/"
LEASE_PREFIXES = (LEASE_PREFIX, LOAD_LEASE_PREFIX)
#: How long one lease generation protects without renewal (seconds).
LEASE_TTL_S = 15 * 60.0
#: How often a holder renews its lease (seconds): a third of the TTL, so two renewals can
#: fail (a store outage) before the lease lapses.
LEASE_RENEW_S = LEASE_TTL_S / 3
#: Slack added to a lease's TTL before it is stale (seconds): the store stamps
#: ``LastModified`` when a write starts or ends and S3's ``Date`` has whole seconds; one
#: minute also covers a renewal that a slow store delays.
LEASE_SKEW_MARGIN_S = 60.0


def lease_ttl(record: Any) -> float:
    """How long a lease body says it protects without renewal (seconds): its ``ttl_s``;
    for a body without one, ``expires_at`` - ``started_at`` (both the holder's clock, so
    their difference is skew-free); 0 for a body that is not a lease (only its age and the
    grace period protect it)."""
    if not isinstance(record, dict):
        return 0.0
    try:
        if record.get("ttl_s") is not None:
            return max(0.0, float(record["ttl_s"]))
        return max(0.0, float(record["expires_at"]) - float(record["started_at"]))
    except (KeyError, TypeError, ValueError):
        return 0.0


def lease_stale(modified: float, record: Any, store_now: float, grace_s: float = 0.0) -> bool:
    """Whether a lease object is stale: its age by the store's clock (``store_now`` -
    ``modified``, both Unix s from ``ObjectStore.server_now`` and ``ObjectInfo.modified``)
    exceeds ``lease_ttl(record)`` + ``LEASE_SKEW_MARGIN_S`` and ``grace_s``. The local
    clock takes no part: a lease renewed within its TTL is live whatever it says."""
    age = store_now - modified
    return age > lease_ttl(record) + LEASE_SKEW_MARGIN_S and age > grace_s


def owner_tag(owner: str) -> str:
    """The lease key's owner part: 16 hex of the owner's SHA-256 (no host names in keys)."""
    return hashlib.sha256(owner.encode()).hexdigest()[:16]


@functools.cache
def host_tag() -> str:
    """This host as a lease's ``holder.host``: 16 hex of the SHA-256 of its name and its pid
    namespace (``/proc/self/ns/pid`` where there is one), so two containers sharing a host
    name but not their pids are two hosts. Never the name itself."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}|{namespace}".encode()).hexdigest()[:16]


def holder_gone(record: Any) -> bool:
    """Whether a lease body's ``holder`` is a process of this host that is gone (``kill -9``):
    its ``host`` is ``host_tag()`` and its ``pid`` no longer runs. Another host's holder, or a
    body without one, is not known to be gone."""
    holder = record.get("holder") if isinstance(record, dict) else None
    if not isinstance(holder, dict) or holder.get("host") != host_tag():
        return False
    pid = holder.get("pid")
    return isinstance(pid, int) and local_process_is_gone(pid)


def write_lease(
    store: ObjectStore,
    key: str,
    run_key: str,
    objects: Sequence[str],
    *,
    ttl_s: float = LEASE_TTL_S,
    renew_s: float = LEASE_RENEW_S,
    facts: Mapping[str, Any] | None = None,
) -> str:
    """Create the lease object ``key`` listing ``objects`` (keys gc must keep) for ``ttl_s``
    seconds after the store stamps it, renewed every ``renew_s`` seconds, with the holder's
    ``facts`` (module docstring); return ``key``.

    :raises ConflictError: the key exists with other bytes.
    :raises EmbedlineError: the store refused the write (its class says why).
    """
    written = time.time()
    record: dict[str, Any] = {
        **(facts or {}),
        "run_key": run_key,
        "started_at": written,
        "objects": list(objects),
        "ttl_s": ttl_s,
        "renew_s": renew_s,
        "expires_at": written + ttl_s,
        "holder": {"host": host_tag(), "pid": os.getpid()},
    }
    body = json.dumps(record).encode()
    store.put_if_absent(
        key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="application/json"
    )
    return key


def drop_lease(store: ObjectStore, key: str) -> None:
    """Delete the lease object ``key`` (its holder ended, whatever its outcome).

    :raises EmbedlineError: the store refused the delete.
    """
    store.delete(key)


@contextlib.contextmanager
def held_lease(
    store: ObjectStore,
    prefix: str,
    run_key: str,
    objects: Sequence[str],
    *,
    ttl_s: float = LEASE_TTL_S,
    renew_s: float = LEASE_RENEW_S,
    facts: Mapping[str, Any] | None = None,
    log: Any = None,
) -> Iterator[str]:
    """Hold a lease under ``prefix`` (``LEASE_PREFIX`` or ``LOAD_LEASE_PREFIX``) on run
    ``run_key``'s ``objects`` for the ``with`` body, its body carrying ``facts``; yield the
    first generation's key.

    Each generation protects for ``ttl_s`` seconds after the store stamps it
    (``lease_stale``); a daemon thread writes
    the next one every ``renew_s`` seconds and deletes the one before. A failure to renew
    or to delete the lease is logged (``log.warning``) and does not fail the holder: a lease
    left behind only delays gc.

    :raises EmbedlineError: the first generation cannot be written (the holder must not
        start unprotected; the store's error says why).
    """
    stem = f"{prefix}{run_key}.{owner_tag(new_owner())}"
    write = functools.partial(
        write_lease,
        store,
        run_key=run_key,
        objects=objects,
        ttl_s=ttl_s,
        renew_s=renew_s,
        facts=facts,
    )
    current = [write(f"{stem}.{0:06d}.json")]
    stop = threading.Event()

    def renew() -> None:
        generation = 0
        while not stop.wait(renew_s):
            generation += 1
            try:
                key = write(f"{stem}.{generation:06d}.json")
                old, current[0] = current[0], key
                drop_lease(store, old)
            except (EmbedlineError, OSError) as exc:
                if log is not None:
                    log.warning("could not renew the lease %s: %s", current[0], exc)

    thread = threading.Thread(target=renew, name=f"lease-{run_key[:8]}", daemon=True)
    thread.start()
    try:
        yield current[0]
    finally:
        stop.set()
        thread.join()
        try:
            drop_lease(store, current[0])
        except (EmbedlineError, OSError) as exc:
            if log is not None:
                log.warning("could not delete the lease %s: %s", current[0], exc)
