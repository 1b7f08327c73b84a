"""The reuse stage (``tasks/reuse/stage.py``): where each row's vector comes from, and each
source object read once per run, however the rows were shuffled (issue 24).

Vectors are checked against the fake server's deterministic vectors for their texts
(``expected_matrix``), never against embedline's own earlier output.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.csv_chunks import read_chunk
from adapters.ledger import Ledger
from adapters.object_store import open_store
from embedline.keys import text_sha256
from embedline.models import InputPlan
from embedline.settings import RunSettings
from tasks.embed.paid import PaidRequests, chunk_name, keep_handed
from tasks.reuse.chunk_side import note_failed, take_prefill, take_reused
from tasks.reuse.stage import ReuseStage
from tests.support.chunks import CountingStore, plan_rows, publish_truth
from tests.support.fake_openai import expected_matrix

RUN = "e" * 64
DIMS = 8
LOG = logging.getLogger("test")


def _plan(tmp: Path, name: str, rows: list[tuple[str, str]], chunk_size: int) -> InputPlan:
    return plan_rows(tmp, name, rows, chunk_size, dimensions=DIMS)


def _publish_truth(store: Any, plan: InputPlan) -> None:
    publish_truth(store, plan, dimensions=DIMS)


def _shuffled_night(
    tmp: Path, rows: list[tuple[str, str]], *, seed: int
) -> tuple[Any, InputPlan, Ledger, ReuseStage, RunSettings]:
    """The first run's objects published (chunks of 10), then the rows shuffled and planned
    again, and that night's reuse stage prepared: (store, plan, ledger, stage, settings)."""
    local = open_store(str(tmp / "out"))
    local.prepare()
    _publish_truth(local, _plan(tmp, "first.csv", rows, 10))
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    plan = _plan(tmp, "night.csv", shuffled, 10)
    ledger = Ledger(str(tmp / "ledger.sqlite3"))
    stage = _stage(tmp, plan, local, ledger)
    stage.prepare(list(plan.chunks))
    settings = RunSettings(
        input=str(tmp / "night.csv"),
        output=str(tmp / "out"),
        model="m",
        dimensions=DIMS,
        embedder="openai",
        ledger=str(tmp / "ledger.sqlite3"),
    )
    return local, plan, ledger, stage, settings


def _stage(tmp: Path, plan: InputPlan, store: Any, ledger: Ledger, **kw: Any) -> ReuseStage:
    return ReuseStage(
        store=store,
        ledger=ledger,
        plan=plan,
        run_key=RUN,
        model="m",
        dimensions=DIMS,
        reuse=kw.get("reuse", True),
        length=DIMS,
        scratch_root=str(tmp),
        log=LOG,
    )


def test_a_shuffled_night_reads_each_source_object_once_and_copies_true_vectors(
    tmp_path: Path,
) -> None:
    rows = [(f"p{i}", f"text number {i}") for i in range(400)]
    first = _plan(tmp_path, "first.csv", rows, 20)  # 20 objects
    local = open_store(str(tmp_path / "out"))
    local.prepare()
    _publish_truth(local, first)
    shuffled = list(rows)
    random.Random(3).shuffle(shuffled)
    plan = _plan(tmp_path, "night.csv", shuffled, 25)  # 16 chunks, each from ~all objects
    store, ledger = CountingStore(local), Ledger(str(tmp_path / "ledger.sqlite3"))
    stage = _stage(tmp_path, plan, store, ledger)
    stage.prepare(list(plan.chunks))
    sources = [k for k in store.opened if k.startswith("chunks/")]
    assert len(sources) == 20
    # refresh_index reads each new object once, the copy once: before, the copy read each
    # object once per chunk that needed a row of it (16 chunks x 20 objects)
    assert max(store.opened[k] for k in sources) == 2, store.opened
    for spec in plan.chunks:
        assert stage.fully_copied(spec)
        chunk_rows = read_chunk(plan.source, spec)
        found = take_prefill(chunk_rows, stage.plan_for(spec))
        assert found.reused == len(chunk_rows)
        got = np.stack([found.vectors[r.row_number] for r in chunk_rows])
        np.testing.assert_array_equal(got, expected_matrix([r.text for r in chunk_rows], DIMS))
    stage.shared_disk = False  # Dask workers elsewhere: the plan carries the copies
    remote = stage.plan_for(plan.chunks[3])
    assert remote.prefill is None and remote.copies
    chunk_rows = read_chunk(plan.source, plan.chunks[3])
    copies = take_prefill(chunk_rows, remote).vectors
    np.testing.assert_array_equal(
        np.stack([copies[r.row_number] for r in chunk_rows]),
        expected_matrix([r.text for r in chunk_rows], DIMS),
    )
    stage.close()
    ledger.close()


def test_only_new_texts_are_left_to_send_and_no_copy_of_another_length(tmp_path: Path) -> None:
    rows = [(f"p{i}", f"text {i}") for i in range(30)]
    local = open_store(str(tmp_path / "out"))
    local.prepare()
    _publish_truth(local, _plan(tmp_path, "first.csv", rows, 10))
    edited = list(rows)
    edited[4] = ("p4", "text 4 edited")
    plan = _plan(tmp_path, "night.csv", edited, 10)
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    stage = _stage(tmp_path, plan, local, ledger)
    stage.prepare(list(plan.chunks))
    c0 = plan.chunks[0]
    assert not stage.fully_copied(c0) and stage.fully_copied(plan.chunks[1])
    got = take_prefill(read_chunk(plan.source, c0), stage.plan_for(c0))
    assert sorted(got.vectors) == [n for n in range(1, 11) if n != 5]  # row 5 is new
    stage.close()
    other = ReuseStage(
        store=local,
        ledger=ledger,
        plan=plan,
        run_key=RUN,
        model="m",
        dimensions=DIMS,
        reuse=True,
        length=DIMS + 1,
        scratch_root=str(tmp_path),
        log=LOG,
    )
    other.prepare(list(plan.chunks))  # the run's length is not the objects': nothing copied
    assert take_prefill(read_chunk(plan.source, c0), other.plan_for(c0)).vectors == {}
    other.close()
    ledger.close()


def test_in_run_owners_and_heirs_are_the_chunks_before_in_order(tmp_path: Path) -> None:
    texts = ["x", "a", "x", "b", "x", "c", "x", "d"]
    plan = _plan(tmp_path, "in.csv", list(enumerate(texts)), 2)
    local = open_store(str(tmp_path / "out"))
    local.prepare()
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    stage = _stage(tmp_path, plan, local, ledger)
    stage.prepare(list(plan.chunks))
    c0, c1, c2, c3 = plan.chunks

    def sources(spec: Any) -> list[tuple[str, tuple[int, ...], Any]]:
        return [(s.object_key, s.rows, s.heirs) for s in stage.plan_for(spec).sources]

    assert sources(c0) == []  # the owner of "x"
    assert sources(c1) == [(c0.object_key, (0,), ())]
    assert sources(c2) == [(c0.object_key, (0,), ((c1.object_key,),))]
    assert sources(c3) == [(c0.object_key, (0,), ((c1.object_key, c2.object_key),))]
    stage.note_failed(c0.index)
    marks = [i.key for i in local.list("_embedline/paid/")]
    assert marks == [
        f"_embedline/paid/{RUN}/{chunk_name(c0.object_key)}/gave-up-{stage.session}.json"
    ]  # for waiters on Dask workers
    stage.close()
    ledger.close()


def test_a_text_a_failed_chunk_kept_earlier_is_copied_from_its_kept_request(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path, "in.csv", list(enumerate(["a", "x", "x", "b"])), 2)
    c0, c1 = plan.chunks
    local = open_store(str(tmp_path / "out"))
    local.prepare()
    vector = expected_matrix(["x"], DIMS)
    PaidRequests(local, RUN, chunk_name(c1.object_key)).keep(
        ["k"], vector, tokens=1, request_key="q", text_hashes=[text_sha256("x")]
    )
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    stage = _stage(tmp_path, plan, local, ledger)
    stage.prepare(list(plan.chunks))
    # chunk 0 does not send "x" again (before this, it owned it and paid): a copy of chunk
    # 1's kept request; chunk 1's own kept request is its own task's (tasks.embed.paid.take_paid)
    rows0 = read_chunk(plan.source, c0)
    found = take_prefill(rows0, stage.plan_for(c0))
    np.testing.assert_array_equal(found.vectors[rows0[1].row_number], vector[0])
    assert stage.plan_for(c0).sources == () and stage.plan_for(c1).prefill is None
    stage.close()
    ledger.close()


def test_texts_handed_over_are_kept_again_for_the_next_heir(tmp_path: Path) -> None:
    """Chunk 0 paid for "x" and failed; chunk 1 takes it from chunk 0's kept requests, then
    fails too; chunk 2 takes it from chunk 1's (it never pays for it again)."""
    plan = _plan(tmp_path, "in.csv", list(enumerate(["x", "a", "x", "b", "x", "c"])), 2)
    c0, c1, c2 = plan.chunks
    local = open_store(str(tmp_path / "out"))
    local.prepare()
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    stage = _stage(tmp_path, plan, local, ledger, reuse=False)
    stage.prepare(list(plan.chunks))
    vector = np.arange(DIMS, dtype=np.float32)
    PaidRequests(local, RUN, chunk_name(c0.object_key)).keep(
        ["k0"], vector[None, :], tokens=1, request_key="q0", text_hashes=[text_sha256("x")]
    )
    stage.note_failed(c0.index)
    rows1 = read_chunk(plan.source, c1)
    found = take_reused(local, rows1, stage.plan_for(c1), model="m", run_key=RUN)
    assert found.handed == {rows1[0].row_number}
    np.testing.assert_array_equal(found.vectors[rows1[0].row_number], vector)
    keep_handed(
        PaidRequests(local, RUN, chunk_name(c1.object_key)),
        [rows1[0]],
        found.vectors,
        model="m",
        dimensions=DIMS,
    )
    stage.note_failed(c1.index)
    rows2 = read_chunk(plan.source, c2)
    found = take_reused(local, rows2, stage.plan_for(c2), model="m", run_key=RUN)
    np.testing.assert_array_equal(found.vectors[rows2[0].row_number], vector)
    note_failed("")  # (the registry is per process: nothing else to undo)
    stage.close()
    ledger.close()


def test_a_fully_copied_chunk_is_the_object_the_chunk_task_would_publish(
    tmp_path: Path,
) -> None:
    """``tasks.reuse.copied_chunk`` builds the object from planning's rows without parsing the
    input: byte for byte the object the chunk task's own path (``run_chunk``) makes of the same
    copies, empty texts (dead letters) included; with kept columns it declines."""
    from tasks.embed.task import run_chunk
    from tasks.reuse.copied_chunk import publish_copied

    rows = [(f"p{i}", f"text {i}" if i % 7 else " ") for i in range(40)]
    local, plan, ledger, stage, settings = _shuffled_night(tmp_path, rows, seed=5)
    for spec in plan.chunks:
        assert stage.fully_copied(spec)
        copies = stage.plan_for(spec)
        quick = open_store(str(tmp_path / "quick"))
        quick.prepare()
        fast = publish_copied(
            spec,
            plan.source,
            settings,
            store=quick,
            scratch=plan.scratch,
            prefill=copies.prefill,
            width=copies.width,
            run_key=RUN,
            logger=LOG,
        )
        slow = run_chunk(spec, plan.source, settings, copies, DIMS, RUN, logger=LOG)
        assert fast is not None and slow.requests == 0
        assert (tmp_path / "quick" / spec.object_key).read_bytes() == (
            tmp_path / "out" / spec.object_key
        ).read_bytes()
        assert (fast.rows, fast.dead_letters, fast.reused, fast.tokens_saved) == (
            slow.rows,
            slow.dead_letters,
            slow.reused,
            slow.tokens_saved,
        )
    kept = plan.source.__class__(
        **{**{f: getattr(plan.source, f) for f in plan.source.__slots__}, "kept_columns": ("x",)}
    )
    assert (
        publish_copied(
            plan.chunks[0],
            kept,
            settings,
            store=local,
            scratch=plan.scratch,
            prefill=stage.plan_for(plan.chunks[0]).prefill,
            width=DIMS,
            run_key=RUN,
            logger=LOG,
        )
        is None
    )
    stage.close()
    ledger.close()


def test_objects_a_run_published_are_indexed_as_the_store_would_index_them(
    tmp_path: Path,
) -> None:
    """``index_published`` indexes this run's objects from planning's rows, dead letters
    (empty texts) left out: the same entries a fresh ledger gets by reading the objects, and
    the next run reads none of them to index them."""
    from adapters.ledger.reuse_index import BUCKETS
    from tasks.reuse.copied_chunk import publish_copied
    from tasks.reuse.row_sources import refresh_index

    rows = [(f"p{i}", f"text {i}" if i % 9 else "") for i in range(50)]
    local, plan, ledger, stage, settings = _shuffled_night(tmp_path, rows, seed=4)
    outcomes = [
        publish_copied(
            spec,
            plan.source,
            settings,
            store=local,
            scratch=plan.scratch,
            prefill=stage.plan_for(spec).prefill,
            width=DIMS,
            run_key=RUN,
            logger=LOG,
        )
        for spec in plan.chunks
    ]
    assert all(o is not None for o in outcomes) and any(o.dead_letters for o in outcomes)
    assert stage.index_published(outcomes) == len(plan.chunks)
    counting = CountingStore(local)
    assert refresh_index(counting, ledger) == 0 and not counting.opened  # nothing to read
    fresh = Ledger(str(tmp_path / "fresh.sqlite3"))
    assert refresh_index(local, fresh) == 2 * len(plan.chunks)

    def entries(led: Ledger) -> set[tuple[str, int, int]]:
        objects = led.reuse_objects(local.uri, model="m", dimensions=str(DIMS))
        out = set()
        for bucket in range(BUCKETS):
            prefixes, ids, positions = led.bucket(bucket, list(objects))
            out |= {
                (objects[int(o)], int(p), int(q))
                for p, o, q in zip(prefixes, ids, positions, strict=True)
            }
        return out

    assert entries(ledger) == entries(fresh)
    stage.close()
    ledger.close()
    fresh.close()


def test_indexing_what_a_run_published_holds_one_batch_of_objects_at_a_time(
    tmp_path: Path,
) -> None:
    """Issue 24 item 1: ``index_published`` once held every published object's text hashes
    until the end of the run (+680 MB of the CLI's peak at 10M rows). Arrow memory in use at
    each ledger write stays near one batch's (``_INDEX_BATCH`` objects), whatever the row
    count, and every object is still indexed."""
    from embedline.models import ChunkOutcome
    from tasks.reuse.stage import _INDEX_BATCH

    rows = [(f"q{i}", f"text {i}") for i in range(40 * _INDEX_BATCH)]
    plan = _plan(tmp_path, "in.csv", rows, 10)  # 4 batches of objects
    local = open_store(str(tmp_path / "out"))
    local.prepare()
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    stage = _stage(tmp_path, plan, local, ledger)
    stage.prepare(list(plan.chunks))  # a first run: nothing to reuse
    outcomes = [
        ChunkOutcome(
            index=s.index, key=s.key, object_key=s.object_key, object_sha256="0" * 64, rows=s.rows
        )
        for s in plan.chunks
    ]

    class Recording:
        def __init__(self) -> None:
            self.calls: list[tuple[int, int]] = []  # (objects, Arrow bytes in use)

        def index_objects(self, uri: str, objects: Any) -> None:
            self.calls.append((len(objects), pa.total_allocated_bytes() - baseline))
            ledger.index_objects(uri, objects)

    recording = Recording()
    stage.ledger = recording  # type: ignore[assignment]
    one_object = 10 * (64 + 4)  # ten hex SHA-256 strings and their offsets
    baseline = pa.total_allocated_bytes()
    assert stage.index_published(outcomes) == len(plan.chunks)
    assert sum(n for n, _ in recording.calls) == len(plan.chunks)
    assert max(n for n, _ in recording.calls) == _INDEX_BATCH
    held = max(b for _, b in recording.calls)
    assert held < 2 * _INDEX_BATCH * one_object, (held, len(plan.chunks) * one_object)
    assert len(ledger.indexed_objects(local.uri)) == len(plan.chunks)
    stage.close()
    ledger.close()
