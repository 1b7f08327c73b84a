"""Ledger transitions, leases, dead letters and concurrency."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from adapters.ledger import SCHEMA_VERSION, Ledger
from embedline.models import ChunkSpec, DeadLetter, InputPlan, InputSource


def _plan(n_chunks: int, rows: int = 10) -> InputPlan:
    source = InputSource("/x.csv", "x.csv", "utf-8", "id", "text", 0, 1, 2, 8)
    chunks = tuple(
        ChunkSpec(i, f"{i:064x}", 1 + i * rows, 2 + i * rows, rows, 0, 0, "h")
        for i in range(n_chunks)
    )
    return InputPlan(source, "f" * 64, 100, rows * n_chunks, chunks)


def _uris(plan: InputPlan, root: str = "/out") -> list[str]:
    return [f"{root}/{c.object_key}" for c in plan.chunks]


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(":memory:")


def _start(ledger: Ledger, plan: InputPlan, run: str = "r" * 64, root: str = "/out") -> str:
    ledger.start_run(
        run, plan, output_uri=root, settings={}, flow_run_id=None, object_uris=_uris(plan, root)
    )
    return run


def test_schema_version_and_wal(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite3")
    assert led.schema_version() == SCHEMA_VERSION
    mode = sqlite3.connect(tmp_path / "l.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    led.close()
    assert Ledger(tmp_path / "l.sqlite3").schema_version() == SCHEMA_VERSION  # reopen: no re-run


def test_claim_publish_and_dead_letters(ledger: Ledger) -> None:
    plan = _plan(2)
    run = _start(ledger, plan)
    spec = plan.chunks[1]
    assert ledger.claim(run, 1, owner="a", lease_s=60)
    assert not ledger.claim(run, 1, owner="b", lease_s=60)  # held by a live lease
    dead = [DeadLetter(spec.first_row + 3, "id-3", "empty_text")]
    ledger.mark_published(
        run, spec, object_uri="/out/" + spec.object_key, sha256="s", rows=9, dead_letters=dead
    )
    assert ledger.chunk_states(run)[1].state == "published"
    assert ledger.published_object("/out/" + spec.object_key).rows == 9
    assert ledger.run_dead_letters(run) == dead
    assert not ledger.claim(run, 1, owner="b", lease_s=60)  # published is final


def test_a_run_started_for_another_output_does_not_keep_the_old_outputs_counts(
    ledger: Ledger,
) -> None:
    """One record per run key: a run of the same input to another output takes it over.
    Before, it kept the counts and manifest of the first output, and ``status`` showed
    "rows=9000/20000" beside that output's 0 published chunks."""
    plan = _plan(2)
    run = _start(ledger, plan, root="/out")
    ledger.finish_run(
        run,
        status="complete",
        rows_published=20,
        rows_failed=0,
        manifest_uri="/out/manifests/m.json",
    )
    _start(ledger, plan, run, root="/out")  # the same output again: its counts stand
    assert (ledger.runs()[0].rows_published, ledger.runs()[0].manifest_uri) == (
        20,
        "/out/manifests/m.json",
    )
    _start(ledger, plan, run, root="/out2")
    record = ledger.runs()[0]
    assert (record.output_uri, record.rows_published, record.rows_failed, record.manifest_uri) == (
        "/out2",
        0,
        0,
        None,
    )


def test_expired_lease_is_reclaimed(ledger: Ledger) -> None:
    run = _start(ledger, _plan(1))
    assert ledger.claim(run, 0, owner="dead-process", lease_s=0.01)
    time.sleep(0.03)
    assert ledger.claim(run, 0, owner="next-run", lease_s=60)
    assert ledger.chunk_states(run)[0].lease_owner == "next-run"
    assert ledger.chunk_states(run)[0].attempts == 2


def test_failed_chunk_can_be_claimed_again_and_release_returns_to_pending(ledger: Ledger) -> None:
    run = _start(ledger, _plan(1))
    assert ledger.claim(run, 0, owner="a", lease_s=60)
    ledger.mark_failed(run, 0, owner="a", error="RetryableError: 503")
    assert ledger.chunk_states(run)[0].state == "failed"
    assert ledger.claim(run, 0, owner="b", lease_s=60)
    ledger.release(run, 0, owner="b")
    assert ledger.chunk_states(run)[0].state == "pending"


def test_rerun_to_another_output_resets_chunks_not_published_there(ledger: Ledger) -> None:
    plan = _plan(1)
    run = _start(ledger, plan, root="/a")
    ledger.mark_published(
        run,
        plan.chunks[0],
        object_uri="/a/" + plan.chunks[0].object_key,
        sha256="s",
        rows=10,
        dead_letters=[],
    )
    _start(ledger, plan, run, root="/b")
    assert ledger.chunk_states(run)[0].state == "pending"
    assert ledger.published_object("/b/" + plan.chunks[0].object_key) is None


def test_find_run_by_prefix(ledger: Ledger) -> None:
    run = _start(ledger, _plan(1), "abcdef12" + "0" * 56)
    assert ledger.find_run("abcdef12").run_key == run
    assert ledger.find_run("00000000") is None
    with pytest.raises(ValueError, match="at least 8 hex"):
        ledger.find_run("abc")


def test_32_threads_drive_500_chunks_without_lock_errors(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    plan = _plan(500, rows=1)
    run = _start(Ledger(path), plan)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        led = Ledger(path)  # one connection per thread, like separate processes
        try:
            for spec in plan.chunks[n::32]:
                assert led.claim(run, spec.index, owner=f"w{n}", lease_s=60)
                led.mark_published(
                    run,
                    spec,
                    object_uri=f"/out/{spec.object_key}",
                    sha256="s",
                    rows=1,
                    dead_letters=[],
                )
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            led.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Ledger(path).state_counts(run) == {"published": 500}


def test_a_chunk_loaded_into_a_sink_stays_loaded_and_the_load_finishes(ledger: Ledger) -> None:
    record = ledger.start_load("lancedb:///x?table=t", "r1", mode="replace")
    assert (record.state, record.mode) == ("loading", "replace")
    ledger.mark_chunk_loaded("lancedb:///x?table=t", "r1", 0, chunk_key="k0", rows=10)
    ledger.mark_chunk_loaded("lancedb:///x?table=t", "r1", 0, chunk_key="k0", rows=10)
    # a resumed load (after a crash) sees chunk 0 as loaded, and keeps it
    assert ledger.start_load("lancedb:///x?table=t", "r1", mode="replace").state == "loading"
    assert ledger.loaded_chunks("lancedb:///x?table=t", "r1") == {0: 10}
    assert ledger.loaded_chunks("lancedb:///other?table=t", "r1") == {}
    ledger.finish_load("lancedb:///x?table=t", "r1", rows_loaded=10, rows_deleted=2)
    assert ledger.start_load("lancedb:///x?table=t", "r1", mode="replace").state == "loaded"
    assert ledger.last_loaded_run("lancedb:///x?table=t") == "r1"


def test_a_load_superseded_by_another_runs_load_starts_over(ledger: Ledger) -> None:
    sink = "postgresql://u@h/db?table=t"
    ledger.start_load(sink, "r1", mode="replace")
    ledger.mark_chunk_loaded(sink, "r1", 0, chunk_key="k0", rows=10)
    time.sleep(0.002)
    ledger.start_load(sink, "r2", mode="replace")
    ledger.finish_load(sink, "r2", rows_loaded=5, rows_deleted=0)
    # r2 overwrote the sink since r1 started: r1's chunk 0 rows may be gone
    assert ledger.start_load(sink, "r1", mode="replace").state == "loading"
    assert ledger.loaded_chunks(sink, "r1") == {}
    # a finished load of r1 older than r2's is no longer "already loaded" either
    ledger.finish_load(sink, "r1", rows_loaded=10, rows_deleted=0)
    time.sleep(0.002)
    ledger.start_load(sink, "r2", mode="replace")
    assert ledger.start_load(sink, "r2", mode="replace").state == "loading"
    assert ledger.last_loaded_run(sink) == "r1"


def _indexed(
    ledger: Ledger, output: str, model: str, dimensions: str
) -> dict[str, list[tuple[str, int]]]:
    """``{hash prefix (16 hex): [(object key, row position), ...]}`` over every bucket."""
    from adapters.ledger.reuse_index import BUCKETS

    objects = ledger.reuse_objects(output, model=model, dimensions=dimensions)
    out: dict[str, list[tuple[str, int]]] = {}
    for bucket in range(BUCKETS):
        prefixes, ids, positions = ledger.bucket(bucket, list(objects))
        assert not len(prefixes) or set((prefixes >> 58).tolist()) == {bucket}
        for prefix, oid, position in zip(prefixes, ids, positions, strict=True):
            out.setdefault(f"{int(prefix):016x}", []).append((objects[int(oid)], int(position)))
    return out


def test_the_reuse_index_gives_every_text_its_objects_and_row_positions(ledger: Ledger) -> None:
    import hashlib

    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(1_203)]
    ledger.index_object(
        "/out", "chunks/1.parquet", model="m", dimensions="", text_hashes=hashes[:1_100]
    )
    ledger.index_object(
        "/out", "chunks/0.parquet", model="m", dimensions="", text_hashes=hashes[1_000:]
    )
    found = _indexed(ledger, "/out", "m", "")
    assert len(found) == 1_203  # every text, spread over the buckets
    assert found[hashes[5][:16]] == [("chunks/1.parquet", 5)]
    assert sorted(found[hashes[1_050][:16]]) == [
        ("chunks/0.parquet", 50),
        ("chunks/1.parquet", 1_050),
    ]
    assert found[hashes[1_202][:16]] == [("chunks/0.parquet", 202)]


def test_reuse_index_matches_output_model_and_dimensions_only(ledger: Ledger) -> None:
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    ledger.index_object("/out", "chunks/1.parquet", model="m", dimensions="", text_hashes=[a, b])
    ledger.index_object("/out", "chunks/1.parquet", model="m", dimensions="", text_hashes=[c])
    ledger.index_object("/out", "chunks/2.parquet", model="m", dimensions="256", text_hashes=[c])
    ledger.index_object("/other", "chunks/3.parquet", model="m", dimensions="", text_hashes=[c])
    assert (
        _indexed(ledger, "/out", "m", "")
        == {  # c only at 256 or under /other
            a[:16]: [("chunks/1.parquet", 0)],
            b[:16]: [("chunks/1.parquet", 1)],
        }
    )
    assert _indexed(ledger, "/out", "m", "256") == {c[:16]: [("chunks/2.parquet", 0)]}
    assert _indexed(ledger, "/out", "other", "") == {}
    assert ledger.indexed_objects("/out") == {"chunks/1.parquet", "chunks/2.parquet"}
    ledger.forget_objects("/out", ["chunks/1.parquet"])
    assert _indexed(ledger, "/out", "m", "") == {}
    assert ledger.indexed_objects("/out") == {"chunks/2.parquet"}


def test_a_stop_never_overwrites_a_finished_run(ledger: Ledger) -> None:
    run = _start(ledger, _plan(2), "ab" * 32)
    ledger.mark_stopped(run, status="crashed")
    assert ledger.find_run(run[:8]).status == "crashed"
    _start(ledger, _plan(2), run)  # the rerun
    ledger.finish_run(
        run,
        status="complete",
        rows_published=20,
        rows_failed=0,
        manifest_uri="/out/manifests/r.json",
    )
    ledger.mark_stopped(run)  # an interrupt that landed just after the commit
    assert ledger.find_run(run[:8]).status == "complete"


def test_record_committed_catches_the_ledger_up_with_the_store_once(ledger: Ledger) -> None:
    run = _start(ledger, _plan(2), "ab" * 32)
    ledger.mark_stopped(run)  # stopped between the manifest's PUT and the ledger's write
    counts = {"manifest_uri": "/out/manifests/r.json", "rows_published": 19, "rows_failed": 1}
    assert ledger.record_committed(run, **counts)
    record = ledger.find_run(run[:8])
    assert (record.status, record.rows_published, record.rows_failed, record.manifest_uri) == (
        "complete",
        19,
        1,
        "/out/manifests/r.json",
    )
    assert not ledger.record_committed(run, **counts)  # already agrees: no write
    assert not ledger.record_committed("cd" * 32, **counts)  # a run this ledger never saw
