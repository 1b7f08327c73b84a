"""The load's lease: what gc must keep while a load reads a run (DESIGN §8, "Retention").

A load (``flows/load.py`` ``load_stage``: ``embedline load`` and ``embedline run --sink``)
holds one lease for its whole length, written before it reads anything and deleted when it
ends, whatever the outcome. The lease lists the run's manifest, its chunk objects and its
change set; gc keeps everything a live lease lists (``tasks/gc.py``), so a sink rolled back
to an older run is never left half one run and half another by a gc meanwhile.

Key: ``_embedline/loads/{run_key}.{owner}.{generation:06d}.json``. Objects are create-only
(``put_if_absent``), so the lease is renewed by writing the next generation and deleting
the one before. Each generation carries ``expires_at`` = written + ``LOAD_LEASE_TTL_S``; a
thread renews it every ``LOAD_LEASE_RENEW_S``, so a lease stays live for as long as its load
runs, whatever gc's ``--grace``. A load killed without its ``finally`` leaves a lease that
protects the run for at most ``LOAD_LEASE_TTL_S`` more, then until it is older than gc's
grace period, when gc deletes it as stale.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from adapters.ledger import new_owner
from embedline.errors import EmbedlineError
from embedline.protocols import ObjectStore
from tasks.gc import LOAD_LEASE_PREFIX, owner_tag, write_lease

__all__ = ["LOAD_LEASE_RENEW_S", "LOAD_LEASE_TTL_S", "load_lease", "load_lease_objects"]

#: How long one lease generation protects the run without renewal (seconds).
LOAD_LEASE_TTL_S = 15 * 60.0
#: How often a running load renews its lease (seconds); a third of the TTL, so two renewals
#: can fail (a store outage) before the lease lapses.
LOAD_LEASE_RENEW_S = LOAD_LEASE_TTL_S / 3


def load_lease_objects(manifest: dict[str, Any]) -> list[str]:
    """The object keys a load of ``manifest`` reads: the manifest, chunks, change set."""
    keys = [f"manifests/{manifest['run_key']}.json"]
    keys += [str(c["object"]) for c in manifest.get("chunks") or []]
    if manifest.get("changes"):
        keys.append(str(manifest["changes"]["object"]))
    return keys


@contextlib.contextmanager
def load_lease(
    store: ObjectStore,
    manifest: dict[str, Any],
    *,
    ttl_s: float = LOAD_LEASE_TTL_S,
    renew_s: float = LOAD_LEASE_RENEW_S,
    log: Any = None,
) -> Iterator[str]:
    """Hold a load lease on ``manifest``'s run under ``store`` for the ``with`` body.

    Yields the first generation's key. A failure to delete or renew the lease is logged
    (``log.warning``) and does not fail the load: a lease left behind only delays gc.

    :raises EmbedlineError: the first lease cannot be written (the load must not start
        unprotected; the store's error says why).
    """
    run_key = str(manifest["run_key"])
    objects = load_lease_objects(manifest)
    stem = f"{LOAD_LEASE_PREFIX}{run_key}.{owner_tag(new_owner())}"
    first = f"{stem}.{0:06d}.json"
    current = [write_lease(store, first, run_key, objects, expires_at=time.time() + ttl_s)]
    stop = threading.Event()

    def renew() -> None:
        generation = 0
        while not stop.wait(renew_s):
            generation += 1
            try:
                key = f"{stem}.{generation:06d}.json"
                write_lease(store, key, run_key, objects, expires_at=time.time() + ttl_s)
                old, current[0] = current[0], key
                store.delete(old)
            except (EmbedlineError, OSError) as exc:
                if log is not None:
                    log.warning("could not renew the load lease %s: %s", current[0], exc)

    thread = threading.Thread(target=renew, name=f"load-lease-{run_key[:8]}", daemon=True)
    thread.start()
    try:
        yield current[0]
    finally:
        stop.set()
        thread.join()
        try:
            store.delete(current[0])
        except (EmbedlineError, OSError) as exc:
            if log is not None:
                log.warning("could not delete the load lease %s: %s", current[0], exc)
