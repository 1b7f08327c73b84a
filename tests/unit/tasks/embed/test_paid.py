"""Kept paid requests on a local directory: kept, read back by a new attempt, cleared."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from adapters.object_store import LocalDirStore
from tasks.embed.paid import PAID_PREFIX, PaidRequests, chunk_name, paid_run_key

RUN = "a" * 64


def _vectors(n: int, dims: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dims)).astype(np.float32)


def test_a_new_attempt_reads_what_the_failed_one_kept_and_clear_removes_it(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    first = PaidRequests(store, RUN, "chunkkey")
    a, b = _vectors(2, seed=1), _vectors(3, seed=2)
    first.keep(["r1", "r2"], a, tokens=7, request_key="q1", text_hashes=["t1", "t2"])
    first.keep(["r3", "r4", "r5"], b, tokens=5, request_key="q2")
    again = PaidRequests(store, RUN, "chunkkey")  # the retry: another process, say
    kept = again.kept()
    assert sorted(kept) == ["r1", "r2", "r3", "r4", "r5"]
    np.testing.assert_array_equal(kept["r2"], a[1])
    np.testing.assert_array_equal(kept["r5"], b[2])
    assert kept["r1"].dtype == np.float32
    assert again.tokens() == 12 and again.requests() == 2
    assert sorted(again.kept_by_text()) == ["t1", "t2"]  # only rows kept with their hash
    assert PaidRequests(store, RUN, "other").kept() == {}
    again.clear()
    assert list(store.list(PAID_PREFIX)) == []
    assert PaidRequests(store, RUN, "chunkkey").kept() == {}


def test_a_keep_the_store_refuses_is_a_warning_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalDirStore(tmp_path)
    (tmp_path / "_embedline").write_text("a file where the directory should be")
    paid = PaidRequests(store, RUN, "c")
    paid.keep(["r1"], _vectors(1), tokens=1, request_key="q")  # no exception
    assert "could not keep a paid request" in caplog.text
    assert "r1" not in caplog.text
    os.unlink(tmp_path / "_embedline")
    with pytest.raises(ValueError):
        paid.keep(["r1", "r2"], _vectors(1), tokens=1, request_key="q")


def test_names() -> None:
    assert chunk_name("chunks/abc.parquet") == "abc"
    assert chunk_name("chunks/abc.g2.parquet") == "abc.g2"
    assert paid_run_key(f"{PAID_PREFIX}{RUN}/abc/q.parquet") == RUN
    assert paid_run_key("_embedline/runs/x.json") is None


def test_the_last_request_is_held_in_memory_and_written_only_if_the_chunk_then_fails(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    published = PaidRequests(store, RUN, "published")
    with published.keep_held_on_failure():
        published.keep(["r1"], _vectors(1, seed=1), tokens=3, request_key="q1")
        published.keep(["r2"], _vectors(1, seed=2), tokens=4, request_key="q2", held=True)
        assert published.tokens() == 7  # held requests count as paid for this attempt
        assert sorted(published.kept()) == ["r1", "r2"]
    published.clear()  # the chunk published: the held one was never written
    assert list(store.list(PAID_PREFIX)) == []

    failing = PaidRequests(store, RUN, "failing")
    last = _vectors(2, seed=3)
    with pytest.raises(OSError), failing.keep_held_on_failure():
        failing.keep(
            ["r3", "r4"], last, tokens=5, request_key="q3", held=True, text_hashes=["t3", "t4"]
        )
        assert list(store.list(PAID_PREFIX)) == []  # nothing written while it may publish
        raise OSError("the publish failed")
    retry = PaidRequests(store, RUN, "failing")  # the next attempt, in another process
    np.testing.assert_array_equal(retry.kept()["r4"], last[1])
    assert retry.tokens() == 5 and sorted(retry.kept_by_text()) == ["t3", "t4"]
