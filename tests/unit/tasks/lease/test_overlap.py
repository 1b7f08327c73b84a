"""Overlapping runs on one output (tasks/lease/overlap.py): which live leases come before a
run's, and the bounded wait for them, on a local directory with recorded sleeps."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from adapters.object_store import LocalDirStore
from tasks.lease.held import LEASE_PREFIX, LEASE_SKEW_MARGIN_S, LEASE_TTL_S, held_lease
from tasks.lease.overlap import earlier_runs, span_text, wait_for_earlier_runs
from tasks.lease.run_lease import run_lease

MODEL = "text-embedding-3-small"


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)

    warning = info


def _plant(
    store: LocalDirStore,
    run_key: str,
    owner: str,
    *,
    age_s: float,
    generation: int = 0,
    **fields: Any,
) -> str:
    """A lease of another holder (another host), stamped ``age_s`` seconds ago."""
    key = f"{LEASE_PREFIX}{run_key}.{owner}.{generation:06d}.json"
    record = {
        "run_key": run_key,
        "objects": [],
        "ttl_s": LEASE_TTL_S,
        "holder": {"host": "elsewhere", "pid": 1},
        "model": MODEL,
        "dimensions": None,
        **fields,
    }
    body = json.dumps(record).encode()
    store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="x")
    then = time.time() - age_s
    os.utime(store.uri_for(key), (then, then))
    return key


def _own(store: LocalDirStore, run_key: str = "c" * 64) -> Any:
    return held_lease(
        store,
        LEASE_PREFIX,
        run_key,
        [],
        facts={"model": MODEL, "dimensions": None},
    )


def _wait(store: LocalDirStore, key: str, bound_s: float, sleep: Any, **kw: Any) -> Any:
    """``wait_for_earlier_runs`` for run ``c…c`` of ``MODEL`` (a log that records, unless
    ``log=`` is given)."""
    kw.setdefault("log", _Log())
    return wait_for_earlier_runs(
        store,
        key,
        run_key="c" * 64,
        model=MODEL,
        dimensions=None,
        bound_s=bound_s,
        sleep=sleep,
        **kw,
    )


def test_an_earlier_live_run_of_the_same_model_comes_before(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    _plant(store, "a" * 64, "1" * 16, age_s=30)
    _plant(store, "b" * 64, "2" * 16, age_s=30, model="other-model")  # copies nothing of ours
    _plant(store, "d" * 64, "3" * 16, age_s=LEASE_TTL_S + LEASE_SKEW_MARGIN_S + 5)  # stale
    with _own(store) as key:
        earlier = earlier_runs(store, key, model=MODEL, dimensions=None)
        assert [lease.run_key for lease in earlier] == ["a" * 64]
        assert earlier_runs(store, key, model=MODEL, dimensions=256) == []


def test_a_renewed_lease_counts_from_its_first_generation(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    # renewed 3 times (15 min), its newest generation written just now: still the earlier
    _plant(store, "a" * 64, "1" * 16, age_s=0, generation=3)
    with _own(store) as key:
        assert [lease.run_key for lease in earlier_runs(store, key, model=MODEL, dimensions=None)]


def test_of_two_runs_starting_together_exactly_one_waits(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    with _own(store, "a" * 64) as first, _own(store, "b" * 64) as second:
        stamp = time.time()
        for key in (first, second):  # the same instant by the store's clock
            os.utime(store.uri_for(key), (stamp, stamp))
        waits = [
            bool(earlier_runs(store, k, model=MODEL, dimensions=None)) for k in (first, second)
        ]
        assert sorted(waits) == [False, True]


def test_a_later_run_never_holds_up_an_earlier_one(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    with _own(store, "a" * 64) as key:
        _plant(store, "b" * 64, "2" * 16, age_s=-5)  # stamped after ours
        assert earlier_runs(store, key, model=MODEL, dimensions=None) == []


def test_a_lease_of_a_gone_local_process_is_not_waited_for(tmp_path: Path) -> None:
    from tasks.lease.held import host_tag

    store = LocalDirStore(str(tmp_path))
    gone = 2**22 + 12345  # above the default pid_max: no such process
    _plant(store, "a" * 64, "1" * 16, age_s=30, holder={"host": host_tag(), "pid": gone})
    with _own(store) as key:
        assert earlier_runs(store, key, model=MODEL, dimensions=None) == []


def test_the_wait_ends_when_the_earlier_lease_is_gone(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    planted = _plant(store, "a" * 64, "1" * 16, age_s=30)
    log, slept = _Log(), []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            store.delete(planted)  # the earlier run committed

    with _own(store) as key:
        waited = _wait(store, key, 60, sleep, log=log)
    assert waited.waited and waited.left == ()
    assert slept == [5.0, 5.0, 5.0]
    assert log.lines[0].startswith(f"waiting for run {'a' * 12}, started ")
    assert "at most 60 s (--wait-for-live-run)" in log.lines[0]
    assert log.lines[-1].startswith("no earlier run on this output is running now")


def test_the_wait_ends_when_the_earlier_lease_turns_stale(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    planted = _plant(store, "a" * 64, "1" * 16, age_s=30)

    def sleep(seconds: float) -> None:  # its holder was killed: no renewal, it ages
        old = time.time() - LEASE_TTL_S - LEASE_SKEW_MARGIN_S - 1
        os.utime(store.uri_for(planted), (old, old))

    with _own(store) as key:
        waited = _wait(store, key, 3600, sleep)
    assert waited.waited and waited.left == ()


def test_past_the_bound_the_earlier_run_is_left(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    _plant(store, "a" * 64, "1" * 16, age_s=30)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with _own(store) as key:
        waited = _wait(store, key, 12, sleep, clock=lambda: now[0])
        zero = _wait(store, key, 0, sleep, clock=lambda: now[0])
    assert now[0] == 12.0 and [lease.run_key for lease in waited.left] == ["a" * 64]
    assert zero.waited and len(zero.left) == 1


def test_no_earlier_run_no_wait(tmp_path: Path) -> None:
    store = LocalDirStore(str(tmp_path))
    with _own(store) as key:
        waited = _wait(store, key, 60, lambda s: None)
    assert not waited.waited


def test_a_run_lease_says_its_model_dimensions_and_holder(tmp_path: Path) -> None:
    from embedline.models import InputPlan

    store = LocalDirStore(str(tmp_path))
    plan: Any = InputPlan.__new__(InputPlan)
    object.__setattr__(plan, "chunks", ())
    object.__setattr__(plan, "delta", None)
    with run_lease(store, "a" * 64, plan, model=MODEL, dimensions=256) as key:
        record = json.loads(store.get(key))
    assert (record["model"], record["dimensions"]) == (MODEL, 256)
    assert record["holder"]["pid"] == os.getpid() and len(record["holder"]["host"]) == 16
    assert record["renew_s"] == 300


def test_span_text() -> None:
    assert span_text(45) == "45 s" and span_text(720) == "12 min"
    assert span_text(3 * 3600 + 300) == "3 h 5 min"
