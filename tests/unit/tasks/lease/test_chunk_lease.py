"""Chunk leases on a local directory: one holder at a time; a copy waits, adopts a
published chunk, or takes over a lease whose holder is gone or silent past its TTL; a
holder that lapsed sends nothing more once another copy took over."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.object_store import LocalDirStore
from tasks.lease.chunk_lease import (
    ChunkLeaseLost,
    chunk_lease_held,
    chunk_lease_prefix,
    take_chunk_lease,
)
from tests.support.fixtures import REPO

RUN = "a" * 64


def _keys(store: LocalDirStore, prefix: str) -> list[str]:
    return sorted(i.key[len(prefix) :] for i in store.list(prefix))


def test_the_first_copy_holds_and_releases_its_lease(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    lease = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=30)
    assert lease is not None
    prefix = chunk_lease_prefix(RUN, "c1")
    assert _keys(store, prefix) == ["000000.000000.json"]
    lease.check()  # within its TTL: goes on
    lease.release()
    assert _keys(store, prefix) == []


def test_a_lease_is_held_while_its_holder_renews_it_and_not_once_released_or_gone(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    assert not chunk_lease_held(store, RUN, "c1")  # never taken
    lease = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=30)
    assert lease is not None
    assert chunk_lease_held(store, RUN, "c1")
    assert not chunk_lease_held(store, RUN, "c2")
    lease.release()
    assert not chunk_lease_held(store, RUN, "c1")
    holder = (  # a holder that dies without releasing (kill -9)
        "import os, sys; from adapters.object_store import LocalDirStore; "
        "from tasks.lease.chunk_lease import take_chunk_lease; "
        "take_chunk_lease(LocalDirStore(sys.argv[1]), sys.argv[2], 'c1', "
        "published=lambda: False, ttl_s=300); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", holder, str(tmp_path), RUN], cwd=REPO, timeout=120)
    assert _keys(store, chunk_lease_prefix(RUN, "c1")) == ["000000.000000.json"]  # left behind
    assert not chunk_lease_held(store, RUN, "c1")


def test_a_second_copy_waits_and_adopts_the_chunk_the_first_published(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    first = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=30)
    assert first is not None
    polls: list[float] = []
    published = [False]

    def sleep(seconds: float) -> None:  # the first copy publishes while the second waits
        polls.append(seconds)
        published[0] = len(polls) >= 2

    second = take_chunk_lease(
        store, RUN, "c1", published=lambda: published[0], ttl_s=30, sleep=sleep
    )
    assert second is None and len(polls) == 2
    first.release()


def test_a_lease_whose_holder_process_is_gone_is_taken_over_at_once(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    holder = (  # a holder that dies without releasing (kill -9): a process of its own
        "import os, sys; from adapters.object_store import LocalDirStore; "
        "from tasks.lease.chunk_lease import take_chunk_lease; "
        "lease = take_chunk_lease(LocalDirStore(sys.argv[1]), sys.argv[2], 'c1', "
        "published=lambda: False, ttl_s=300); os._exit(0 if lease else 1)"
    )
    done = subprocess.run(
        [sys.executable, "-c", holder, str(tmp_path), RUN], cwd=REPO, check=False, timeout=120
    )
    assert done.returncode == 0
    waited: list[float] = []
    second = take_chunk_lease(
        store, RUN, "c1", published=lambda: False, ttl_s=300, sleep=waited.append
    )
    assert second is not None and second.epoch == 1 and waited == []
    assert _keys(store, chunk_lease_prefix(RUN, "c1")) == ["000001.000000.json"]
    second.release()


def test_a_paused_holder_past_its_ttl_loses_the_chunk_to_the_copy_that_took_it(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    first = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=0.3)
    assert first is not None
    first._stop.set()  # paused: no renewal (SIGSTOP stops every thread)
    time.sleep(2.5)  # past TTL + slack (2 s) by the store's clock
    second = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=30)
    assert second is not None and second.epoch == 1
    with pytest.raises(ChunkLeaseLost):
        first.check()  # woken up: it must not send
    second.check()
    second.release()


def test_a_lapsed_holder_that_no_one_replaced_takes_the_next_epoch_and_goes_on(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    lease = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=0.2)
    assert lease is not None
    lease._stop.set()
    time.sleep(0.3)
    lease.check()
    assert lease.epoch == 1
    assert _keys(store, chunk_lease_prefix(RUN, "c1")) == ["000001.000000.json"]
    lease.release()
