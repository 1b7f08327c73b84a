"""The reuse stage reads each earlier object once per run on S3, however shuffled the rows
(issue 24): a fresh ledger (a new machine) against a moto bucket holding the first run's
chunk objects; the store's reads are counted per object key, and the copies are checked
against the fake server's vectors for their texts."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest

from adapters.csv_chunks import read_chunk
from adapters.ledger import Ledger
from adapters.object_store import open_store
from tasks.reuse.chunk_side import take_prefill
from tasks.reuse.stage import ReuseStage
from tests.support.chunks import CountingStore, plan_rows, publish_truth
from tests.support.fake_openai import expected_matrix

pytestmark = pytest.mark.integration


def test_a_fresh_ledger_reads_each_s3_object_once_for_the_index_and_once_for_the_copies(
    tmp_path: Path,
    s3_bucket: str,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    rows = [(f"pkg-{i}", f"a description of package {i}") for i in range(600)]
    s3 = open_store(f"s3://{s3_bucket}/out")
    s3.prepare()
    publish_truth(s3, plan_rows(tmp_path, "first.csv", rows, 40))  # 15 objects
    shuffled = list(rows)
    random.Random(11).shuffle(shuffled)
    plan = plan_rows(tmp_path, "night.csv", shuffled, 50)  # 12 chunks, each from ~all 15
    store = CountingStore(s3)
    ledger = Ledger(str(tmp_path / "fresh-ledger.sqlite3"))
    stage = ReuseStage(
        store=store,
        ledger=ledger,
        plan=plan,
        run_key="f" * 64,
        model="m",
        dimensions=8,
        reuse=True,
        length=8,
        scratch_root=str(tmp_path),
        log=logging.getLogger("test"),
    )
    stage.prepare(list(plan.chunks))
    reads = {k: n for k, n in store.opened.items() if k.startswith("chunks/")}
    assert len(reads) == 15 and set(reads.values()) == {2}, reads  # before: up to 1 + 12 each
    for spec in plan.chunks:
        chunk = read_chunk(plan.source, spec)
        copies = take_prefill(chunk, stage.plan_for(spec)).vectors
        assert stage.fully_copied(spec) and len(copies) == len(chunk)
        np.testing.assert_array_equal(
            np.stack([copies[r.row_number] for r in chunk]),
            expected_matrix([r.text for r in chunk], 8),
        )
    stage.close()
    ledger.close()


@pytest.mark.parametrize("ledger_saw", ["each run", "nothing (a fresh ledger)"])
def test_a_text_several_runs_hold_is_copied_from_the_newest_run_only(
    tmp_path: Path,
    ledger_saw: str,
) -> None:
    """Two runs' objects hold every text (a night, then a reordered night). The next night
    reads only the newer run's objects, each once: the join's pick among a text's sources
    was arbitrary (by object key), so it read both runs' objects (twice the objects)."""
    import os

    rows = [(f"pkg-{i}", f"a description of package {i}") for i in range(600)]
    local = open_store(str(tmp_path / "out"))
    local.prepare()
    older = publish_truth(local, plan_rows(tmp_path, "first.csv", rows, 40))  # 15 objects
    for outcome in older.values():  # an hour older than the next night's objects
        path = tmp_path / "out" / outcome.object_key
        os.utime(path, (path.stat().st_mtime - 3600, path.stat().st_mtime - 3600))
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    shuffled = random.Random(12).sample(rows, len(rows))
    if ledger_saw == "each run":
        from tasks.reuse.row_sources import refresh_index

        refresh_index(local, ledger)  # the first run's objects, indexed by the first run
    newer = publish_truth(local, plan_rows(tmp_path, "second.csv", shuffled, 50))  # 12
    night = plan_rows(tmp_path, "night.csv", rows[::2], 45)  # base order, half deleted
    store = CountingStore(local)
    stage = ReuseStage(
        store=store,
        ledger=ledger,
        plan=night,
        run_key="e" * 64,
        model="m",
        dimensions=8,
        reuse=True,
        length=8,
        scratch_root=str(tmp_path),
        log=logging.getLogger("test"),
    )
    stage.prepare(list(night.chunks))
    indexed_before = 1 if ledger_saw == "each run" else 0  # the first run's own index
    reads = {k: n for k, n in store.opened.items() if k.startswith("chunks/")}
    assert {k: reads.get(k, 0) for k in (o.object_key for o in older.values())} == dict.fromkeys(
        (o.object_key for o in older.values()), 1 - indexed_before
    ), reads
    assert {k: reads.get(k, 0) for k in (o.object_key for o in newer.values())} == dict.fromkeys(
        (o.object_key for o in newer.values()), 2
    ), reads  # index + copies
    for spec in night.chunks:
        chunk = read_chunk(night.source, spec)
        copies = take_prefill(chunk, stage.plan_for(spec)).vectors
        assert stage.fully_copied(spec)
        np.testing.assert_array_equal(
            np.stack([copies[r.row_number] for r in chunk]),
            expected_matrix([r.text for r in chunk], 8),
        )
    stage.close()
    ledger.close()
