"""Retention policy on a local directory: ages, counts, grace period, leases."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from adapters.object_store import LocalDirStore
from tasks.gc import LEASE_PREFIX, parse_age, plan_gc

DAY = 86400.0


def test_parse_age_accepts_units_and_refuses_the_rest() -> None:
    assert parse_age("90d") == 90 * DAY and parse_age("36h") == 36 * 3600
    assert parse_age("2w") == 14 * DAY and parse_age("45s") == 45 and parse_age("7") == 7 * DAY
    with pytest.raises(ValueError, match="90d"):
        parse_age("ninety days")


def _put(store: LocalDirStore, key: str, body: bytes, age_s: float) -> None:
    store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="x")
    then = time.time() - age_s
    os.utime(store.uri_for(key), (then, then))


def _manifest(store: LocalDirStore, run: str, days_ago: float, chunks: list[str]) -> None:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - days_ago * DAY))
    body = json.dumps({"format": "embedline.manifest.v2", "run_key": run, "created_at": created,
                       "chunks": [{"object": c, "rows": 1} for c in chunks],
                       "changes": {"object": f"changes/{run}.parquet"}}).encode()
    _put(store, f"manifests/{run}.json", body, days_ago * DAY)
    _put(store, f"changes/{run}.parquet", run.encode(), days_ago * DAY)


def test_plan_keeps_newest_runs_young_objects_and_leased_objects(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    for name, age in (("a", 30), ("b", 20), ("c", 10), ("orphan", 5), ("leased", 5)):
        _put(store, f"chunks/{name}.parquet", name.encode(), age * DAY)
    _put(store, "chunks/young.parquet", b"young", 3600)  # within the 24 h grace period
    _manifest(store, "r1", 30, ["chunks/a.parquet"])
    _manifest(store, "r2", 20, ["chunks/a.parquet", "chunks/b.parquet"])
    _manifest(store, "r3", 10, ["chunks/c.parquet"])
    lease = json.dumps({"run_key": "r4", "objects": ["chunks/leased.parquet"]}).encode()
    _put(store, f"{LEASE_PREFIX}r4.x.json", lease, 60)
    _put(store, f"{LEASE_PREFIX}dead.x.json", b"{}", 3 * DAY)  # a run that died long ago

    def names(items: list) -> set[str]:
        return {i.key.rsplit("/", 1)[-1] for i in items}

    plan = plan_gc(store, keep_runs=2)
    assert plan.kept_runs == ["r3", "r2"]
    assert names(plan.manifests) == {"r1.json"} and names(plan.changes) == {"r1.parquet"}
    assert names(plan.chunks) == {"orphan.parquet"}  # a: r2 keeps it; leased, young: kept
    assert names(plan.stale) == {"dead.x.json"}
    by_age = plan_gc(store, older_than_s=15 * DAY)
    assert by_age.kept_runs == ["r3"]
    both = plan_gc(store, keep_runs=2, older_than_s=15 * DAY)  # goes only if both agree
    assert both.kept_runs == ["r3", "r2"]
    assert plan_gc(store).kept_runs == ["r3", "r2", "r1"]  # no rule: keep every manifest
    assert plan_gc(store, keep_runs=1, grace_s=40 * DAY).totals() == (0, 0)
