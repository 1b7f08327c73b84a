"""Retention policy on a local directory: ages, counts, grace period, leases."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.object_store import LocalDirStore
from tasks.embed.paid import PAID_PREFIX
from tasks.gc.retention import collect, parse_age, plan_gc
from tasks.lease.held import (
    LEASE_PREFIX,
    LEASE_SKEW_MARGIN_S,
    LEASE_TTL_S,
    LOAD_LEASE_PREFIX,
    held_lease,
    lease_stale,
    lease_ttl,
)
from tasks.lease.load_lease import load_lease
from tasks.lease.run_lease import run_lease

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
    body = json.dumps(
        {
            "format": "embedline.manifest.v2",
            "run_key": run,
            "created_at": created,
            "chunks": [{"object": c, "rows": 1} for c in chunks],
            "changes": {"object": f"changes/{run}.parquet"},
        }
    ).encode()
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


def _dataset_manifest(store: LocalDirStore, run: str, days_ago: float, **fields: object) -> None:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - days_ago * DAY))
    record = {
        "format": "embedline.manifest.v2",
        "run_key": run,
        "created_at": created,
        "chunks": [{"object": f"chunks/{run}.parquet", "rows": 1}],
        "changes": None,
        "id_column": "id",
        "text_column": "text",
        "model": "m1",
        "dimensions": 8,
    }
    record.update(fields)
    _put(store, f"manifests/{run}.json", json.dumps(record).encode(), days_ago * DAY)
    _put(store, f"chunks/{run}.parquet", run.encode(), days_ago * DAY)


def test_a_run_past_the_rules_but_within_the_grace_keeps_its_objects_and_says_so(
    tmp_path: Path,
) -> None:
    """keep-runs 1 with two runs of today: the older one's manifest stays for the grace
    period, so an old object only it lists (a delta night's inherited object) must stay too,
    and the report counts that run as kept for now, not as deleted."""
    from cli.gc import format_report

    store = LocalDirStore(tmp_path)
    _put(store, "chunks/old-only-r2.parquet", b"x", 30 * DAY)
    _put(store, "chunks/new.parquet", b"y", 3600)
    _manifest(store, "r2", 0.1, ["chunks/old-only-r2.parquet"])
    _manifest(store, "r3", 0.05, ["chunks/new.parquet"])
    plan = plan_gc(store, keep_runs=1)
    assert plan.kept_runs == ["r3"]
    assert plan.chunks == [] and plan.manifests == []
    (entry,) = plan.datasets
    assert (entry.deleted, entry.young) == ([], ["r2"])
    assert "would delete 0 (1 more once older than --grace)" in format_report(plan, dry_run=True)
    collect(store, plan, ledger=None, grace_s=24 * 3600)
    assert (tmp_path / "chunks/old-only-r2.parquet").exists()


def test_retention_counts_runs_per_dataset_never_across(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    _dataset_manifest(store, "text1", 30)
    _dataset_manifest(store, "text2", 20)
    _dataset_manifest(store, "title1", 10, text_column="title")  # other input column
    _dataset_manifest(store, "model1", 5, model="m2")  # other model
    _dataset_manifest(store, "dims1", 6, model="m2", dimensions=4)  # other length
    _dataset_manifest(store, "tmpl1", 7, text_template="{title}: {text}")  # other template
    _dataset_manifest(store, "tmpl2", 3, text_template="{title}: {text}")

    plan = plan_gc(store, keep_runs=1)
    assert sorted(plan.kept_runs) == ["dims1", "model1", "text2", "title1", "tmpl2"]
    assert {i.key for i in plan.manifests} == {"manifests/text1.json", "manifests/tmpl1.json"}
    assert {i.key for i in plan.chunks} == {"chunks/text1.parquet", "chunks/tmpl1.parquet"}
    by_dataset = {
        (
            d.fields["text_column"],
            d.fields["model"],
            d.fields["dimensions"],
            d.fields["text_template"],
        ): (d.kept, d.deleted)
        for d in plan.datasets
    }
    assert by_dataset == {
        ("text", "m1", 8, None): (["text2"], ["text1"]),
        ("title", "m1", 8, None): (["title1"], []),
        ("text", "m2", 8, None): (["model1"], []),
        ("text", "m2", 4, None): (["dims1"], []),
        ("text", "m1", 8, "{title}: {text}"): (["tmpl2"], ["tmpl1"]),
    }
    # an age rule too: each dataset's newest stays although every run is older than 1 day
    assert sorted(plan_gc(store, older_than_s=DAY).kept_runs) == sorted(plan.kept_runs)
    label = next(d for d in plan.datasets if d.fields["text_column"] == "title").label()
    assert label == "id_column=id text_column=title model=m1 dimensions=8"


def test_a_live_load_lease_keeps_its_run_whatever_the_grace(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    _dataset_manifest(store, "old", 20)
    _dataset_manifest(store, "new", 10)
    manifest = json.loads(store.get("manifests/old.json"))
    with load_lease(store, manifest) as key:
        assert key.startswith(LOAD_LEASE_PREFIX)  # fresh by the store's clock: live
        plan = plan_gc(store, keep_runs=1, grace_s=0)
        assert plan.kept_runs == ["new", "old"] and plan.manifests == plan.chunks == []
        assert plan.datasets[0].kept == ["new", "old"] and plan.datasets[0].deleted == []
        assert plan.stale == []
    assert list(store.list(LOAD_LEASE_PREFIX)) == []  # the load ended: its lease went
    plan = plan_gc(store, keep_runs=1, grace_s=0)
    assert [i.key for i in plan.manifests] == ["manifests/old.json"]
    # a load that starts after the plan: collect re-reads the leases and keeps the run
    with load_lease(store, manifest):
        done = collect(store, plan, ledger=None, grace_s=0)
    assert done.manifests == done.chunks == [] and done.kept_runs == ["new", "old"]
    assert store.head_sha256("manifests/old.json") and store.head_sha256("chunks/old.parquet")


def test_a_load_lease_is_renewed_and_an_expired_one_is_stale(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    _dataset_manifest(store, "old", 20)
    manifest = json.loads(store.get("manifests/old.json"))
    with load_lease(store, manifest, ttl_s=60, renew_s=0.05) as first:
        deadline = time.monotonic() + 10
        while [i.key for i in store.list(LOAD_LEASE_PREFIX)] == [first]:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.02)
        time.sleep(0.2)
        leases = list(store.list(LOAD_LEASE_PREFIX))
        assert len(leases) <= 2 and first not in {i.key for i in leases}  # old ones deleted
        record = json.loads(store.get(leases[-1].key))
        assert record["objects"] == ["manifests/old.json", "chunks/old.parquet"]
        assert record["expires_at"] > time.time() + 50
    assert list(store.list(LOAD_LEASE_PREFIX)) == []
    # a load that died: its lease expired and is older than the grace period
    dead = json.dumps(
        {"run_key": "old", "objects": ["chunks/old.parquet"], "expires_at": time.time() - 60}
    ).encode()
    _put(store, f"{LOAD_LEASE_PREFIX}old.dead.000000.json", dead, 2 * DAY)
    _dataset_manifest(store, "new", 10)
    plan = plan_gc(store, keep_runs=1)
    assert [i.key for i in plan.stale] == [f"{LOAD_LEASE_PREFIX}old.dead.000000.json"]
    assert [i.key for i in plan.chunks] == ["chunks/old.parquet"]


def test_paid_requests_of_a_live_run_are_kept_abandoned_ones_go(tmp_path: Path) -> None:
    from tasks.embed.paid import PAID_PREFIX

    store = LocalDirStore(tmp_path)
    live, dead, young, done = "1" * 64, "2" * 64, "3" * 64, "4" * 64
    lease = json.dumps({"run_key": live, "objects": []}).encode()
    _put(store, f"{LEASE_PREFIX}{live}.x.json", lease, 3600)  # a run in progress
    _put(store, f"{PAID_PREFIX}{live}/c1/q1.parquet", b"live", 3 * DAY)  # its old failure
    _put(store, f"{PAID_PREFIX}{dead}/c2/q2.parquet", b"dead", 3 * DAY)  # no lease: abandoned
    _put(store, f"{PAID_PREFIX}{dead}/c2/gave-up-ab.json", b"{}", 3 * DAY)
    _put(store, f"{PAID_PREFIX}{young}/c3/q3.parquet", b"young", 3600)  # a rerun may take it
    _put(store, "chunks/c4.parquet", b"published", 3600)
    _put(store, f"{PAID_PREFIX}{done}/c4/q4.parquet", b"done", 60)  # its chunk is published
    plan = plan_gc(store)
    assert sorted(i.key for i in plan.stale) == [
        f"{PAID_PREFIX}{dead}/c2/gave-up-ab.json",
        f"{PAID_PREFIX}{dead}/c2/q2.parquet",
        f"{PAID_PREFIX}{done}/c4/q4.parquet",
    ]
    collect(store, plan, ledger=None, grace_s=DAY)
    left = sorted(i.key for i in store.list(PAID_PREFIX))
    assert left == [f"{PAID_PREFIX}{live}/c1/q1.parquet", f"{PAID_PREFIX}{young}/c3/q3.parquet"]
    # the run ends (its lease goes): its old paid request is abandoned now
    store.delete(f"{LEASE_PREFIX}{live}.x.json")
    assert [i.key for i in plan_gc(store).stale] == [f"{PAID_PREFIX}{live}/c1/q1.parquet"]


def _plan(*chunk_keys: str) -> Any:
    """What ``run_lease`` reads of an ``InputPlan``: its chunks' object keys."""
    return SimpleNamespace(
        chunks=[SimpleNamespace(object_key=f"chunks/{k}.parquet") for k in chunk_keys],
        delta=None,
    )


def test_a_live_run_lease_keeps_its_run_whatever_the_grace(tmp_path: Path) -> None:
    """A run in progress (its lease written as ``Run.leased`` writes it) keeps its planned
    chunk objects, their later generations, its manifest, change set and paid requests,
    even from ``--grace 0s``: a lease within its TTL by the store's clock is live."""
    store = LocalDirStore(tmp_path)
    run = "5" * 64
    for name in ("c0.parquet", "c1.parquet", "c1.g1.parquet", "other.parquet"):
        _put(store, f"chunks/{name}", name.encode(), 3 * DAY)
    _put(store, f"{PAID_PREFIX}{run}/c2/q.parquet", b"paid", 3 * DAY)
    _put(store, f"{PAID_PREFIX}{'6' * 64}/c2/q.parquet", b"abandoned", 3 * DAY)
    with run_lease(store, run, _plan("c0", "c1", "c2")) as key:
        assert key.startswith(LEASE_PREFIX)
        record = json.loads(store.get(key))
        assert record["objects"] == [
            "chunks/c0.parquet",
            "chunks/c1.parquet",
            "chunks/c2.parquet",
            f"manifests/{run}.json",
            f"changes/{run}.parquet",
        ]
        assert record["ttl_s"] == 15 * 60  # fresh by the store's clock: live, grace or not
        _put(store, f"manifests/{run}.json", b"{}", 0)  # the commit, then a gc at once
        _put(store, f"changes/{run}.parquet", b"changes", 0)
        plan = plan_gc(store, grace_s=0)
        assert [i.key for i in plan.chunks] == ["chunks/other.parquet"]
        assert plan.changes == []
        assert [i.key for i in plan.stale] == [f"{PAID_PREFIX}{'6' * 64}/c2/q.parquet"]
        done = collect(store, plan, ledger=None, grace_s=0)
        assert [i.key for i in done.chunks] == ["chunks/other.parquet"]
        assert store.head_sha256(key) and store.head_sha256(f"{PAID_PREFIX}{run}/c2/q.parquet")
        assert store.head_sha256("chunks/c1.g1.parquet")
    assert list(store.list(LEASE_PREFIX)) == []  # the run ended: its lease went
    assert [i.key for i in plan_gc(store, grace_s=0).stale] == [
        f"{PAID_PREFIX}{run}/c2/q.parquet"
    ]  # nothing protects them any more


def test_a_run_lease_is_renewed_and_an_expired_one_is_collected(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    run = "7" * 64
    _put(store, "chunks/c0.parquet", b"c0", 3 * DAY)
    with held_lease(
        store, LEASE_PREFIX, run, ["chunks/c0.parquet"], ttl_s=60, renew_s=0.05
    ) as first:
        # a renewal writes the next lease before it deletes this one (never a moment
        # without a lease), so wait for both halves
        deadline = time.monotonic() + 10
        while first in (held := {i.key for i in store.list(LEASE_PREFIX)}) or not held:
            assert time.monotonic() < deadline, "the lease was never renewed and deleted"
            time.sleep(0.02)
        assert held and first not in held  # a newer one holds, the old one went
    # a run killed (no `finally`): its last lease expired and is older than the grace period
    dead = json.dumps(
        {"run_key": run, "objects": ["chunks/c0.parquet"], "expires_at": time.time() - 60}
    ).encode()
    _put(store, f"{LEASE_PREFIX}{run}.dead.000003.json", dead, 2 * DAY)
    _put(store, f"{PAID_PREFIX}{run}/c0/q.parquet", b"paid", 2 * DAY)
    plan = plan_gc(store, grace_s=0)
    assert sorted(i.key for i in plan.stale) == [
        f"{PAID_PREFIX}{run}/c0/q.parquet",
        f"{LEASE_PREFIX}{run}.dead.000003.json",
    ]
    assert [i.key for i in plan.chunks] == ["chunks/c0.parquet"]
    # expired, but younger than the grace period (killed an hour ago): still kept
    assert plan_gc(store, grace_s=3 * DAY).stale == []


class _RenewedWhileListed(LocalDirStore):
    """A store whose first read of a lease finds it renewed after gc listed it: the holder
    wrote the next generation and deleted the listed one (as ``held_lease`` does)."""

    renewed = False

    def get(self, key: str) -> bytes:
        if key.startswith(LEASE_PREFIX) and not self.renewed:
            self.renewed = True
            body = super().get(key)
            next_key = key.replace(".000000.json", ".000001.json")
            self.put_if_absent(
                next_key,
                body,
                sha256=hashlib.sha256(body).hexdigest(),
                content_type="application/json",
            )
            self.delete(key)
        return super().get(key)


def test_a_lease_renewed_between_gc_listing_and_reading_it_still_protects(tmp_path: Path) -> None:
    store = _RenewedWhileListed(tmp_path)
    run = "8" * 64
    _put(store, "chunks/c0.parquet", b"c0", 3 * DAY)
    with held_lease(store, LEASE_PREFIX, run, ["chunks/c0.parquet"]):
        plan = plan_gc(store, grace_s=0)
    assert store.renewed and plan.chunks == [] and plan.stale == []


def test_a_path_with_no_output_is_refused_and_a_run_in_progress_is_an_output(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The CLI and the gc-output flow both plan with plan_gc: a mistyped output (or S3
    prefix) is an input error, not "deleted 0 objects", and the only line said (no
    warning about the clock of a directory that does not exist before it)."""
    from embedline.errors import InputError

    with pytest.raises(InputError, match="holds no embedline output") as info:
        plan_gc(LocalDirStore(str(tmp_path / "typo")))
    assert info.value.exit_code == 2
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    store = LocalDirStore(str(tmp_path / "out"))
    _put(store, f"{LEASE_PREFIX}run.json", b"{}", age_s=0)  # only a first run's lease
    plan = plan_gc(store, grace_s=0)
    assert not plan.manifests and not plan.chunks and not plan.changes


def test_lease_age_is_judged_by_the_store_clock_with_a_margin() -> None:
    ttl = LEASE_TTL_S
    fresh = {"ttl_s": ttl}
    assert not lease_stale(1000.0, fresh, 1000.0 + ttl + LEASE_SKEW_MARGIN_S)  # on the edge
    assert lease_stale(1000.0, fresh, 1000.0 + ttl + LEASE_SKEW_MARGIN_S + 1)
    assert not lease_stale(1000.0, fresh, 1000.0 + 2 * ttl, grace_s=3 * ttl)  # within grace
    # a body without ttl_s: expires_at - started_at, both the holder's clock (skew cancels)
    legacy = {"started_at": 5e9, "expires_at": 5e9 + 600}
    assert lease_ttl(legacy) == 600 and not lease_stale(0.0, legacy, 600 + LEASE_SKEW_MARGIN_S)
    assert lease_ttl(None) == 0 and lease_ttl({"ttl_s": "x"}) == 0  # not a lease: age alone
    assert lease_stale(0.0, None, LEASE_SKEW_MARGIN_S + 1)


def test_local_server_now_is_a_probe_files_mtime_and_leaves_nothing(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    store.prepare()
    (tmp_path / "_embedline").mkdir()
    before = time.time()
    now = store.server_now()
    assert before - 1 <= now <= time.time() + 1
    assert [p.name for p in tmp_path.rglob("*")] == ["_embedline"]


@pytest.mark.parametrize("skew_s", [20 * 60.0, -20 * 60.0])
def test_gc_on_a_host_whose_clock_is_off_keeps_a_live_lease_and_drops_an_expired_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    """gc's host clock 20 min ahead or behind (``time.time`` shifted; the filesystem
    keeps its own): a lease the store stamped just now is live with ``grace 0``, and one
    the store stamped 30 min ago (TTL 15 min) is stale. Judged by ``expires_at`` against
    the local clock, the first went with 20 min ahead and the second stayed with 20 min
    behind."""
    store = LocalDirStore(tmp_path)
    live, dead = "a" * 64, "b" * 64
    for name in ("live", "dead"):
        _put(store, f"chunks/{name}.parquet", name.encode(), 3 * DAY)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew_s)
    with held_lease(store, LEASE_PREFIX, live, ["chunks/live.parquet"]) as key:
        store.put_if_absent(  # written by a host 20 min off, 30 min ago by the store's clock
            f"{LEASE_PREFIX}{dead}.x.000000.json",
            body := json.dumps(
                {
                    "run_key": dead,
                    "objects": ["chunks/dead.parquet"],
                    "started_at": time.time() - 1800,
                    "expires_at": time.time() - 1800 + LEASE_TTL_S,
                }
            ).encode(),
            sha256=hashlib.sha256(body).hexdigest(),
            content_type="x",
        )
        then = real() - 1800
        os.utime(store.uri_for(f"{LEASE_PREFIX}{dead}.x.000000.json"), (then, then))
        plan = plan_gc(store, grace_s=0)
        done = collect(store, plan, ledger=None, grace_s=0)
        assert [i.key for i in done.chunks] == ["chunks/dead.parquet"]
        assert [i.key for i in done.stale] == [f"{LEASE_PREFIX}{dead}.x.000000.json"]
        assert store.head_sha256(key) and store.head_sha256("chunks/live.parquet")
