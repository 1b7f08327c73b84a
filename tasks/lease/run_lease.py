"""The run's lease: what gc must keep while a run embeds, publishes, commits and loads
(docs/reference/output-layout.md, "Leases").

A run (``flows/run.py`` ``Run.leased``) holds one lease (``tasks.lease.held.held_lease``, key
``_embedline/runs/…``) from before it looks for published chunks until it ends (its load
with ``--sink`` included), whatever the outcome. The lease lists every chunk object the run
plans (gc keeps their later generations ``….g{N}.parquet`` too), its manifest and its change
set; a live run lease also keeps the run's paid requests (``_embedline/paid/{run_key}/``,
``tasks/embed/paid.py``). Like a load's, it carries ``expires_at`` and is renewed while the run
runs, so a run of any length is protected, even from ``gc --grace 0s``. It also says which
vectors the run may send (``model``, requested ``dimensions``): a later run that could copy
them waits for it (``tasks/lease/overlap.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from embedline.models import InputPlan, manifest_object_key
from embedline.protocols import ObjectStore
from tasks.commit.changes import changes_object_key
from tasks.lease.held import LEASE_PREFIX, LEASE_RENEW_S, LEASE_TTL_S, held_lease

__all__ = ["run_lease", "run_lease_objects"]


def run_lease_objects(run_key: str, plan: InputPlan) -> list[str]:
    """The object keys run ``run_key`` of ``plan`` needs kept: its planned chunk objects
    (generation 0; gc keeps each one's later generations with it), those a delta night
    inherits, manifest, change set."""
    inherited = plan.delta.inherited if plan.delta is not None else ()
    return [
        *(c.object_key for c in plan.chunks),
        *(str(e["object"]) for e in inherited),
        manifest_object_key(run_key),
        changes_object_key(run_key),
    ]


@contextlib.contextmanager
def run_lease(
    store: ObjectStore,
    run_key: str,
    plan: InputPlan,
    *,
    model: str | None = None,
    dimensions: int | None = None,
    ttl_s: float = LEASE_TTL_S,
    renew_s: float = LEASE_RENEW_S,
    log: Any = None,
) -> Iterator[str]:
    """Hold run ``run_key``'s lease under ``store`` for the ``with`` body, saying it embeds
    with ``model`` at requested ``dimensions`` (None: the server's default); yield the first
    generation's key (``tasks.lease.held.held_lease``: ``ttl_s``, ``renew_s`` in seconds;
    renewal and delete failures logged on ``log``).

    :raises EmbedlineError: the first lease cannot be written (the store's error says why).
    """
    with held_lease(
        store,
        LEASE_PREFIX,
        run_key,
        run_lease_objects(run_key, plan),
        ttl_s=ttl_s,
        renew_s=renew_s,
        facts={"model": model, "dimensions": dimensions},
        log=log,
    ) as key:
        yield key
