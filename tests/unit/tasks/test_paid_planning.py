"""Who embeds a text whose in-run owner failed (issue 26 item 1): the first chunk that waited
for it, and nobody for a text a failed chunk of an earlier process already paid for."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from adapters.csv_source import plan_csv
from adapters.ledger import Ledger
from adapters.object_store import open_store
from embedline.keys import text_sha256
from tasks.paid import PaidRequests, chunk_name, keep_handed
from tasks.reuse import ReusePlanner, chunk_rows, take_reused

RUN = "e" * 64
PLAN_ARGS = dict(id_column="id", text_column="text", codec="auto", chunk_size=2, model="m",
                 dimensions=None, delimiter="auto")


def _planner(tmp_path: Path, texts: list[str]) -> tuple[ReusePlanner, object, object]:
    path = tmp_path / "in.csv"
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
    plan = plan_csv(path, **PLAN_ARGS)
    store = open_store(str(tmp_path / "out"))
    store.prepare()
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    return ReusePlanner(ledger=ledger, store=store, source=plan.source, model="m",
                        dimensions=None, reuse=True, run_key=RUN), plan, store


def _sources(plan) -> list[tuple[str, tuple[int, ...], bool, str]]:
    return [(s.object_key, s.rows, s.owner_failed, s.heirs) for s in plan.sources]


def test_the_first_waiter_of_a_failed_owner_owns_its_texts(tmp_path: Path) -> None:
    planner, plan, _ = _planner(tmp_path, ["x", "a", "x", "b", "x", "c", "x", "d"])
    c0, c1, c2, c3 = plan.chunks
    assert _sources(planner.resolve(c0)) == []
    assert _sources(planner.resolve(c1)) == [(c0.object_key, (0,), False, ())]  # waits
    # a second waiter falls back on the first one if chunk 0 fails, not on paying itself
    assert _sources(planner.resolve(c2)) == [(c0.object_key, (0,), False, ((c1.object_key,),))]
    planner.note_failed(c0.index)
    # before: chunk 3 became the owner too, and chunks 1, 2 and 3 all paid for "x"; now
    # it waits for chunk 1, and for chunk 2 should chunk 1 fail as well
    assert _sources(planner.resolve(c3)) == [(c1.object_key, (0,), False, ((c2.object_key,),))]
    marks = [i.key for i in planner._store.list("_embedline/paid/")]
    assert marks == [f"_embedline/paid/{RUN}/{chunk_name(c0.object_key)}/"
                     f"gave-up-{planner._session}.json"]  # for waiters on Dask workers


def test_a_text_a_failed_chunk_kept_earlier_is_taken_from_it(tmp_path: Path) -> None:
    planner, plan, store = _planner(tmp_path, ["a", "x", "x", "b"])
    c0, c1 = plan.chunks
    PaidRequests(store, RUN, chunk_name(c1.object_key)).keep(
        ["k"], np.ones((1, 3), np.float32), tokens=1, request_key="q",
        text_hashes=[text_sha256("x")])  # chunk 1 paid for "x", then the process died
    planner = ReusePlanner(ledger=planner._ledger, store=store, source=planner._source,
                           model="m", dimensions=None, reuse=True, run_key=RUN)
    # chunk 0 does not send "x" again (before: it owned it and paid): it reads chunk 1's
    assert _sources(planner.resolve(c0)) == [(c1.object_key, (1,), True, ())]
    assert _sources(planner.resolve(c1)) == []  # its own: taken by its task


def test_texts_handed_over_are_kept_again_for_the_next_heir(tmp_path: Path) -> None:
    """Chunk 0 paid for "x" and failed; chunk 1 took it from chunk 0's kept requests, then
    failed too; chunk 2 takes it from chunk 1's (before: chunk 1 had not kept it, chunk 2
    paid for it again)."""
    planner, plan, store = _planner(tmp_path, ["x", "a", "x", "b", "x", "c"])
    c0, c1, c2 = plan.chunks
    vector = np.arange(3, dtype=np.float32)
    PaidRequests(store, RUN, chunk_name(c0.object_key)).keep(
        ["k0"], vector[None, :], tokens=1, request_key="q0", text_hashes=[text_sha256("x")])
    planner.resolve(c0)
    planner.note_failed(c0.index)
    rows1 = chunk_rows(planner._source, c1)
    found = take_reused(store, rows1, planner.resolve(c1), model="m", run_key=RUN)
    assert found.handed == {rows1[0].row_number}
    np.testing.assert_array_equal(found.vectors[rows1[0].row_number], vector)
    keep_handed(PaidRequests(store, RUN, chunk_name(c1.object_key)),
                [rows1[0]], found.vectors, model="m", dimensions=None)
    planner.note_failed(c1.index)
    rows2 = chunk_rows(planner._source, c2)
    found = take_reused(store, rows2, planner.resolve(c2), model="m", run_key=RUN)
    np.testing.assert_array_equal(found.vectors[rows2[0].row_number], vector)
