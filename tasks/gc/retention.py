"""Retention: delete what no kept run needs from an output root (``embedline gc``).

Policy (docs/reference/output-layout.md, "Retention"):

- **Manifests**, per dataset: the manifests that share ``dataset_key`` (input columns,
  model, dimensions and whatever else the manifest records of the input's shape,
  ``tasks/commit/manifest.py``) are one dataset; retention counts within it, never across. Each
  dataset's manifests sorted newest first by ``created_at``. With ``keep_runs`` N the newest N
  are kept; with ``older_than_s`` those younger than that are kept; with both, a manifest
  is deleted only when both rules let it go; with neither, every manifest is kept. The
  newest manifest of each dataset is always kept.
- **Chunk and change-set objects** (``chunks/``, ``changes/``) that no kept manifest
  references are deleted.
- **Leases** (``tasks/lease/held.py``): every run (``_embedline/runs/``,
  ``tasks/lease/run_lease.py``) holds one from before it looks for published chunks until it
  ends, listing its planned chunk objects, its manifest and its change set; every load
  (``_embedline/loads/``, ``tasks/lease/load_lease.py``) holds one from before it reads
  anything, listing the run's manifest, chunk objects and change set. A lease is **live**
  while its age by the store's clock (``tasks.lease.held.lease_stale``: ``LastModified``
  against ``ObjectStore.server_now``) is within its ``ttl_s`` plus a 1 min skew margin,
  whatever the grace period (its holder renews it every 5 min while it runs), or while it is
  younger than the grace period. Everything a live lease lists is kept: the objects it
  names, a listed chunk object's later generations (``chunks/{key}.g{N}.parquet``), and, for
  a run lease, the run's paid requests. A lease that expired and is older than the grace
  period belonged to a holder that died (``kill -9``) and is deleted itself; what it listed
  is then judged like anything else.
- **Never** deleted: anything younger than the grace period (``grace_s``, default 24 h: the
  object's ``LastModified``/mtime against the store's clock, ``server_now``); anything a
  kept manifest or a live lease references, so a run or load in progress keeps what it needs
  even with ``--grace 0s``. Leases are listed again just before deleting, and a run
  re-checks (HEAD) its chunk objects before committing its manifest, so a run that starts
  while gc runs at worst has to be rerun, never commits a dangling manifest.
- **Paid requests** (``_embedline/paid/{run_key}/…``, ``tasks/embed/paid.py``): the vectors a
  chunk kept of requests it paid for before failing. Never deleted while their run holds
  a live lease (a run in progress, whatever the grace period; one killed less than the
  lease's 15 min + 1 min margin or the grace period ago); otherwise deleted once older than
  the grace period (a rerun within it still takes them), or at once when their chunk's object
  exists (the chunk was published; a best-effort delete after publishing failed).
- **Temp files** of dead writers (local directories) and conditional-write probe scratch
  objects older than the grace period.
- **Ledger rows** that refer to deleted objects (published objects, the reuse index, dead
  letters of chunk keys no object has any more; runs whose manifest went are marked
  ``collected``), when a ledger is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.ledger import Ledger
from adapters.object_store import SCRATCH_PREFIX
from embedline.errors import InputError
from embedline.models import chunk_generation
from embedline.protocols import ObjectInfo, ObjectStore
from tasks.commit.manifest import created_at, dataset_key, list_manifests
from tasks.embed.paid import PAID_PREFIX, chunk_name, paid_run_key
from tasks.lease.held import LEASE_PREFIX, LEASE_PREFIXES, lease_stale

__all__ = [
    "DEFAULT_GRACE_S",
    "DatasetRetention",
    "GcPlan",
    "collect",
    "parse_age",
    "plan_gc",
]

DEFAULT_GRACE_S = 24 * 3600.0
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 86400.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_GENERATION = re.compile(r"\.g[0-9]+\.parquet$")
_LEASE_READS = 3  # listings of the leases when one vanishes between listing and reading


def parse_age(text: str) -> float:
    """Return seconds for ``90d``, ``36h``, ``2w``, ``30m``, ``45s`` (a bare number: days).

    :raises ValueError: anything else.
    """
    match = _AGE.match(text)
    if match is None and text.strip().startswith("-"):
        raise ValueError(f"an age is 0 or more, got {text!r}; use e.g. 0s, 36h, 2w")
    if match is None:
        raise ValueError(f"not an age: {text!r}; use e.g. 90d, 36h, 2w")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


# --------------------------------------------------------------------------- leases


def _live_leases(
    store: ObjectStore, grace_s: float, now: float
) -> tuple[set[str], list[ObjectInfo]]:
    """(objects protected by live run and load leases, stale lease objects). A lease is
    live unless ``lease_stale`` by the store's clock ``now`` (Unix s) and ``grace_s``. A live
    run lease also protects its run's paid requests: its set holds
    ``{PAID_PREFIX}{run_key}/``.

    A listed lease gone when read was released, or renewed (the next generation written,
    then this one deleted) after the listing: the leases are listed again, up to
    ``_LEASE_READS`` times, so a renewal racing gc never leaves its run unprotected.
    """
    for _ in range(_LEASE_READS):
        protected, stale, vanished = _read_leases(store, grace_s, now)
        if not vanished:
            break
    return protected, stale


def _read_leases(
    store: ObjectStore, grace_s: float, now: float
) -> tuple[set[str], list[ObjectInfo], bool]:
    """One listing of the leases: ``_live_leases``' pair and whether one listed lease was
    gone when read."""
    protected: set[str] = set()
    stale: list[ObjectInfo] = []
    vanished = False
    for prefix in LEASE_PREFIXES:
        for info in store.list(prefix):
            try:
                record = json.loads(store.get(info.key))
                objects = list(record["objects"])
            except FileNotFoundError:
                vanished = True  # its holder ended, or renewed it after the listing
                continue
            except (ValueError, KeyError, TypeError):
                record, objects = None, []  # unreadable: only its age protects it
            if lease_stale(info.modified, record, now, grace_s):
                stale.append(info)
                continue
            protected.update(str(o) for o in objects)
            run_key = record.get("run_key") if isinstance(record, dict) else None
            if prefix == LEASE_PREFIX and isinstance(run_key, str):
                protected.add(f"{PAID_PREFIX}{run_key}/")
    return protected, stale, vanished


def _leased(key: str, protected: set[str]) -> bool:
    """Whether a live lease keeps ``key``: it lists it, or ``key`` is a later generation
    (``chunks/{k}.g{N}.parquet``) of a chunk object it lists (a run writes the generation
    its plan does not name when it retries dead letters)."""
    if key in protected:
        return True
    return chunk_generation(key) > 0 and _GENERATION.sub(".parquet", key) in protected


def _paid_kept(key: str, protected: set[str]) -> bool:
    """Whether ``key`` is a paid request of a run a live lease protects."""
    run_key = paid_run_key(key)
    return run_key is not None and f"{PAID_PREFIX}{run_key}/" in protected


def _paid_published(key: str, published: set[str]) -> bool:
    """Whether ``key`` is a paid request of a chunk whose object exists."""
    parts = key[len(PAID_PREFIX) :].split("/")
    return paid_run_key(key) is not None and parts[1] in published


# --------------------------------------------------------------------------- plan and act


@dataclass(slots=True)
class DatasetRetention:
    """One dataset's retention: its key fields (column names, model, dimensions; no input
    text or values), the run keys kept, the run keys whose manifests go, and ``young``: those
    past the retention rules whose manifests are younger than the grace period (kept for now)."""

    fields: dict[str, Any]
    kept: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    young: list[str] = field(default_factory=list)

    def label(self) -> str:
        """``id_column=id text_column=text model=m dimensions=8`` (fields in key order; a
        value holding a space or a line break, as a template may, in JSON quotes)."""
        return " ".join(f"{k}={_shown(v)}" for k, v in self.fields.items() if v is not None)


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if any(c.isspace() for c in text) else text


@dataclass(slots=True)
class GcPlan:
    """What gc deletes (or would): objects by kind, and the manifests it keeps."""

    kept_runs: list[str] = field(default_factory=list)
    # objects old enough to go that no kept run lists but a live lease does (a run or load
    # in progress needs them): kept, and counted so the report does not read "kept 0 runs"
    leased: int = 0
    manifests: list[ObjectInfo] = field(default_factory=list)
    chunks: list[ObjectInfo] = field(default_factory=list)
    changes: list[ObjectInfo] = field(default_factory=list)
    stale: list[ObjectInfo] = field(default_factory=list)  # leases and probe scratch
    temp_files: list[str] = field(default_factory=list)  # local paths, already removed
    datasets: list[DatasetRetention] = field(default_factory=list)

    def groups(self) -> dict[str, list[ObjectInfo]]:
        """Deletions by kind (``manifests``, ``chunks``, ``changes``, ``stale``)."""
        return {
            "manifests": self.manifests,
            "chunks": self.chunks,
            "changes": self.changes,
            "stale": self.stale,
        }

    def totals(self) -> tuple[int, int]:
        """(objects, bytes) to delete, temp files not included."""
        items = [i for group in self.groups().values() for i in group]
        return len(items), sum(i.size_bytes for i in items)


def _kept_manifests(
    manifests: Sequence[dict[str, Any]],
    keep_runs: int | None,
    older_than_s: float | None,
    now: float,
) -> tuple[list[dict[str, Any]], list[DatasetRetention]]:
    """(manifests kept, per-dataset retention): the rules apply within each dataset."""
    datasets: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for manifest in manifests:
        datasets.setdefault(tuple(dataset_key(manifest).items()), []).append(manifest)
    kept: list[dict[str, Any]] = []
    report: list[DatasetRetention] = []
    for key, members in sorted(datasets.items(), key=lambda kv: repr(kv[0])):
        ordered = sorted(members, key=lambda m: (created_at(m), m["run_key"]), reverse=True)
        entry = DatasetRetention(fields=dict(key))
        for rank, manifest in enumerate(ordered):
            by_count = keep_runs is not None and rank < keep_runs
            age_s = now - created_at(manifest).timestamp()
            by_age = older_than_s is not None and age_s < older_than_s
            no_rule = keep_runs is None and older_than_s is None
            if rank == 0 or by_count or by_age or no_rule:
                kept.append(manifest)
                entry.kept.append(str(manifest["run_key"]))
            else:
                entry.deleted.append(str(manifest["run_key"]))
        report.append(entry)
    return kept, report


def _pin(plan: GcPlan, protected: set[str]) -> None:
    """Count a run whose manifest a live lease lists (a load in progress) as kept."""
    for entry in plan.datasets:
        pinned = [r for r in entry.deleted if f"manifests/{r}.json" in protected]
        entry.deleted = [r for r in entry.deleted if r not in pinned]
        entry.kept += pinned
        plan.kept_runs += [r for r in pinned if r not in plan.kept_runs]


def _defer_young(plan: GcPlan) -> None:
    """Count a run past the rules whose manifest the grace period keeps (not in
    ``plan.manifests``) as ``young``, not deleted: the report says what goes now."""
    going = {info.key for info in plan.manifests}
    for entry in plan.datasets:
        entry.young = [r for r in entry.deleted if f"manifests/{r}.json" not in going]
        entry.deleted = [r for r in entry.deleted if f"manifests/{r}.json" in going]


def _referenced(manifests: Iterable[dict[str, Any]]) -> set[str]:
    keys: set[str] = set()
    for manifest in manifests:
        keys.update(str(c["object"]) for c in manifest["chunks"])
        if manifest.get("changes"):
            keys.add(str(manifest["changes"]["object"]))
        keys.add(f"manifests/{manifest['run_key']}.json")
    return keys


def plan_gc(
    store: ObjectStore,
    *,
    keep_runs: int | None = None,
    older_than_s: float | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    now: float | None = None,
) -> GcPlan:
    """Decide what to delete; deletes nothing. Ages in seconds; ``now`` a Unix time, by
    default the store's clock (``store.server_now()``: every age gc judges is the store's).

    :raises InputError: (exit 2) nothing is under the output's folders: a mistyped path or
        prefix, which would otherwise read as "deleted 0 objects" (the CLI and the
        ``gc-output`` flow alike).
    """
    now = store.server_now() if now is None else now
    cutoff = now - grace_s
    manifests = list(list_manifests(store))
    kept, datasets = _kept_manifests(manifests, keep_runs, older_than_s, now)
    # a manifest past the rules but within the grace period stays: so do its objects (by the
    # store's clock, as every age here; an old object only it lists would leave it unreadable)
    manifest_objects = list(store.list("manifests/"))  # listed once: ages here, plan below
    written = {info.key: info.modified for info in manifest_objects}
    young = [m for m in manifests if written.get(f"manifests/{m['run_key']}.json", now) >= cutoff]
    keep = _referenced([*kept, *young])
    protected, stale_leases = _live_leases(store, grace_s, now)
    plan = GcPlan(kept_runs=[str(m["run_key"]) for m in kept], datasets=datasets)
    _pin(plan, protected)
    published: set[str] = set()
    seen = 0  # objects under manifests/, chunks/ and changes/
    for prefix, bucket, infos in (
        ("manifests/", plan.manifests, manifest_objects),
        ("chunks/", plan.chunks, store.list("chunks/")),
        ("changes/", plan.changes, store.list("changes/")),
    ):
        for info in infos:
            seen += 1
            if prefix == "chunks/":
                published.add(chunk_name(info.key))
            if info.key in keep or info.modified >= cutoff:
                continue
            if _leased(info.key, protected):
                plan.leased += 1
            else:
                bucket.append(info)
    _defer_young(plan)
    listed = list(store.list(SCRATCH_PREFIX))
    if not seen and not listed:  # _embedline/ alone: a first run in progress is an output
        raise InputError(
            f"{store.uri} holds no embedline output (nothing under manifests/, "
            "chunks/, changes/ or _embedline/): check the path"
        )
    plan.stale = stale_leases + [
        i
        for i in listed
        if not i.key.startswith(LEASE_PREFIXES)
        and not _paid_kept(i.key, protected)
        and (i.modified < cutoff or _paid_published(i.key, published))
    ]
    return plan


def collect(
    store: ObjectStore,
    plan: GcPlan,
    *,
    ledger: Ledger | None,
    grace_s: float,
    now: float | None = None,
) -> GcPlan:
    """Carry out ``plan``: delete its objects (leases first re-read), sweep temp files,
    and drop the ledger rows that referred to deleted objects. Returns what was deleted.
    ``now``: as in ``plan_gc`` (the store's clock by default)."""
    now = store.server_now() if now is None else now
    protected, _ = _live_leases(store, grace_s, now)  # a run or load started meanwhile
    done = GcPlan(
        kept_runs=plan.kept_runs,
        datasets=plan.datasets,
        leased=plan.leased,
        stale=[i for i in plan.stale if not _paid_kept(i.key, protected)],
    )
    done.chunks = [i for i in plan.chunks if not _leased(i.key, protected)]
    done.changes = [i for i in plan.changes if not _leased(i.key, protected)]
    done.manifests = [i for i in plan.manifests if not _leased(i.key, protected)]
    done.leased += sum(
        len(planned) - len(kept)
        for planned, kept in (
            (plan.chunks, done.chunks),
            (plan.changes, done.changes),
            (plan.manifests, done.manifests),
        )
    )
    _pin(done, protected)
    for group in (done.manifests, done.changes, done.chunks, done.stale):
        for info in group:
            store.delete(info.key)
    done.temp_files = store.sweep_temp_files(grace_s, now=now)
    if ledger is not None:
        ledger.forget_collected(
            store.uri,
            object_keys=[i.key for i in done.chunks],
            object_uris=[store.uri_for(i.key) for i in done.chunks],
            manifest_uris=[store.uri_for(i.key) for i in done.manifests],
        )
    return done
