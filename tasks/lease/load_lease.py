"""The load's lease: what gc must keep while a load reads a run (docs/reference/output-layout.md,
"Leases").

A load (``flows/load.py`` ``load_stage``: ``embedline load`` and ``embedline run --sink``)
holds one lease (``tasks.lease.held.held_lease``, key ``_embedline/loads/…``) for its whole
length, written before it reads anything and deleted when it ends, whatever the outcome. The
lease lists the run's manifest, its chunk objects and its change set; gc keeps everything a
live lease lists (``tasks/gc/retention.py``), so a sink rolled back to an older run is never left
half one run and half another by a gc meanwhile. Renewal and expiry: ``tasks/lease/held.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from embedline.protocols import ObjectStore
from tasks.lease.held import LEASE_RENEW_S, LEASE_TTL_S, LOAD_LEASE_PREFIX, held_lease

__all__ = ["LOAD_LEASE_RENEW_S", "LOAD_LEASE_TTL_S", "load_lease", "load_lease_objects"]

#: How long one lease generation protects the run without renewal (seconds).
LOAD_LEASE_TTL_S = LEASE_TTL_S
#: How often a running load renews its lease (seconds).
LOAD_LEASE_RENEW_S = LEASE_RENEW_S


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
    """Hold a load lease on ``manifest``'s run under ``store`` for the ``with`` body; yield
    the first generation's key (``tasks.lease.held.held_lease``: ``ttl_s``, ``renew_s`` in
    seconds; renewal and delete failures logged on ``log``).

    :raises EmbedlineError: the first lease cannot be written (the load must not start
        unprotected; the store's error says why).
    """
    with held_lease(
        store,
        LOAD_LEASE_PREFIX,
        str(manifest["run_key"]),
        load_lease_objects(manifest),
        ttl_s=ttl_s,
        renew_s=renew_s,
        log=log,
    ) as key:
        yield key
