"""``flows.run.Run``, the object both the flow and the CLI's path without Prefect drive, on
a local directory store and a ledger in a temporary directory, without Prefect.

Chunks are "embedded" here with the fake server's deterministic vectors and published with
the real ``publish_chunk``: what ``Run`` commits is checked against those, not against its
own output.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adapters.csv_chunks import read_chunk
from adapters.csv_source import plan_csv
from adapters.object_store import open_store
from embedline import keys
from embedline.models import DeadLetter
from embedline.settings import RunSettings
from embedline.summary import RunSummary
from flows.dispatch import DispatchResult
from flows.run import CommittedRun, Run, RunRefused, RunStopped, Work
from tasks.embed.rows import EmbeddedRows
from tasks.publish.chunk_object import publish_chunk
from tests.support.csv_data import write_rows
from tests.support.fake_openai import expected_matrix
from tests.support.fixtures import REPO

DIMS = 8
LOG = logging.getLogger("test.run")


def _settings(tmp_path: Path, **overrides: object) -> RunSettings:
    parameters: dict[str, object] = {
        "input": str(tmp_path / "in.csv"),
        "output": str(tmp_path / "out"),
        "ledger": str(tmp_path / "ledger.sqlite3"),
        "chunk_size": 3,
        "embedder": "openai",
        "dimensions": DIMS,
        **overrides,
    }
    return RunSettings.from_parameters(parameters)


def _open(settings: RunSettings) -> Run:
    return Run.open(
        settings,
        store=open_store(settings.output),
        plan_input=lambda s: plan_csv(s.input, **s.plan_arguments),
        log=LOG,
    )


def _publish_all(run: Run, *, empty_ids: tuple[str, ...] = ()) -> None:
    """Publish every chunk of the run as the chunk task would (fake vectors)."""
    for spec in run.plan.chunks:
        rows = [r for r in read_chunk(run.plan.source, spec) if r.id not in empty_ids]
        vectors = expected_matrix([r.text for r in rows], DIMS).astype(np.float32)
        model = run.settings.effective_model
        row_keys = [keys.row_key(r.id, r.text_sha256, model, DIMS) for r in rows]
        publish_chunk(
            run.store,
            spec,
            EmbeddedRows(rows, vectors, row_keys),
            model=model,
            dimensions=DIMS,
            request_settings=run.settings.request_fingerprint,
        )


def _ledger_status(tmp_path: Path, run_key: str) -> str:
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        return db.execute("SELECT status FROM runs WHERE run_key = ?", (run_key,)).fetchone()[0]


def _concluded(run: Run) -> RunSummary | CommittedRun:
    """``conclude``'s committed run, or the summary it stopped with (``RunStopped``)."""
    run.open_ledger()
    try:
        with run.recorded(flow_run_id=None):
            run.check_store()
            work = run.work_left()
            with run.leased():
                return run.conclude(work, DispatchResult())
    except RunStopped as stopped:
        return stopped.summary
    finally:
        run.close()


@pytest.fixture
def rows(tmp_path: Path) -> list[tuple[str, str]]:
    data = [(f"r{i}", f"text number {i}") for i in range(7)]
    write_rows(tmp_path / "in.csv", data)
    return data


def test_an_input_error_is_a_summary_before_anything_is_recorded(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("id,body\n1,x\n")
    with pytest.raises(RunRefused) as refused:
        Run.open(
            _settings(tmp_path),
            store=open_store(str(tmp_path / "out")),
            plan_input=lambda s: plan_csv(s.input, **s.plan_arguments),
            log=LOG,
        )
    opened = refused.value.summary
    assert (opened.exit_code, opened.status) == (2, "input_error")
    assert "text" in opened.message
    assert not (tmp_path / "ledger.sqlite3").exists()


def test_nothing_published_leaves_every_chunk_to_embed(tmp_path: Path, rows: list) -> None:
    run = _open(_settings(tmp_path))
    assert len(run.plan.chunks) == 3 and run.committed is None
    run.open_ledger()
    with run.recorded(flow_run_id=None):
        work = run.work_left()
        assert isinstance(work, Work)
        assert [c.index for c in work.todo] == [0, 1, 2] and not work.skipped
        assert run.needs_dispatch(work)
        assert _ledger_status(tmp_path, run.run_key) == "running"
        with pytest.raises(RunStopped) as stopped:
            run.conclude(work, DispatchResult())  # a dispatch that published nothing
    run.close()
    ended = stopped.value.summary
    assert (ended.exit_code, ended.status) == (1, "incomplete")
    assert ended.message.startswith("3 of 3 chunks not published")
    assert (ended.chunks_not_run, ended.rows_total) == (3, 7)
    assert _ledger_status(tmp_path, run.run_key) == "incomplete"
    assert not (tmp_path / "out/manifests").exists()


def test_published_chunks_are_committed_with_the_served_vectors(tmp_path: Path, rows: list) -> None:
    run = _open(_settings(tmp_path))
    _publish_all(run)
    ended = _concluded(run)
    assert isinstance(ended, CommittedRun)
    summary = ended.summary
    assert (summary.exit_code, summary.status, summary.rows_published) == (0, "complete", 7)
    assert summary.message == "every chunk was already published: committed without embedding"
    assert (summary.rows_added, summary.chunks_skipped, summary.dimensions) == (7, 3, DIMS)
    manifest = json.loads((tmp_path / "out/manifests" / f"{run.run_key}.json").read_text())
    assert manifest == ended.manifest and manifest["rows_published"] == 7
    assert _ledger_status(tmp_path, run.run_key) == "complete"
    assert not list((tmp_path / "out").glob("leases/*")), "the lease is dropped"
    import pandas as pd

    from tasks.load.read_run import read_embeddings

    frame = read_embeddings(str(tmp_path / "out"), run.run_key)
    got = np.stack(frame.sort_values("id")["embedding"].to_numpy())
    want = expected_matrix([t for _, t in sorted(rows)], DIMS)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert isinstance(frame, pd.DataFrame)


def test_a_committed_run_opens_as_committed_and_writes_nothing(tmp_path: Path, rows: list) -> None:
    run = _open(_settings(tmp_path))
    _publish_all(run)
    assert isinstance(_concluded(run), CommittedRun)
    before = sorted(p.name for p in (tmp_path / "out").rglob("*"))
    again = _open(_settings(tmp_path))
    assert again.committed is not None
    summary = again.already_committed()
    assert (summary.exit_code, summary.status, summary.rows_published) == (0, "already_complete", 7)
    assert summary.manifest_uri and summary.manifest_uri.endswith(f"{run.run_key}.json")
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == before


def test_blocking_dead_letters_keep_the_manifest_uncommitted(tmp_path: Path, rows: list) -> None:
    """A chunk published without one of its rows (rejected by the server: a dead letter)
    is not committed unless ``allow_failed_rows``; then it is, and counts the row."""
    run = _open(_settings(tmp_path))
    for spec in run.plan.chunks:  # chunk 0 loses r1: a dead letter of kind rejected
        rows_ = read_chunk(run.plan.source, spec)
        kept = [r for r in rows_ if r.id != "r1"]
        dead = [DeadLetter(r.row_number, r.id, "rejected", 400) for r in rows_ if r.id == "r1"]
        model = run.settings.effective_model
        vectors = expected_matrix([r.text for r in kept], DIMS).astype(np.float32)
        publish_chunk(
            run.store,
            spec,
            EmbeddedRows(
                kept,
                vectors,
                [keys.row_key(r.id, r.text_sha256, model, DIMS) for r in kept],
                dead_letters=dead,
            ),
            model=model,
            dimensions=DIMS,
            request_settings=run.settings.request_fingerprint,
        )
    ended = _concluded(run)
    assert isinstance(ended, RunSummary)
    assert (ended.exit_code, ended.status, ended.rows_failed) == (1, "dead_letters", 1)
    assert not (tmp_path / "out/manifests").exists()
    assert _ledger_status(tmp_path, run.run_key) == "dead_letters"
    committed = _concluded(_open(_settings(tmp_path, allow_failed_rows=True)))
    assert isinstance(committed, CommittedRun) and committed.summary.rows_failed == 1


@pytest.mark.parametrize(
    ("error", "status"), [(KeyboardInterrupt(), "interrupted"), (RuntimeError("bug"), "crashed")]
)
def test_an_error_out_of_the_recorded_block_marks_the_run(
    tmp_path: Path, rows: list, error: BaseException, status: str
) -> None:
    run = _open(_settings(tmp_path))
    run.open_ledger()
    with pytest.raises(type(error)), run.recorded(flow_run_id=None):
        raise error
    run.close()
    assert _ledger_status(tmp_path, run.run_key) == status


def test_a_deleted_object_is_forgotten_and_nothing_is_committed(tmp_path: Path, rows: list) -> None:
    run = _open(_settings(tmp_path))
    _publish_all(run)
    run.open_ledger()
    with run.recorded(flow_run_id=None):
        work = run.work_left()
        assert isinstance(work, Work) and len(work.skipped) == 3
        (tmp_path / "out" / work.skipped[1].object_key).unlink()  # gc, by hand
        with pytest.raises(RunStopped) as stopped:
            run.conclude(work, DispatchResult())
    run.close()
    ended = stopped.value.summary
    assert (ended.exit_code, ended.status) == (1, "incomplete")
    assert "1 chunk objects were deleted" in ended.message
    assert not (tmp_path / "out/manifests").exists()
    again = _open(_settings(tmp_path))
    again.open_ledger()
    with again.recorded(flow_run_id=None):
        work = again.work_left()
    again.close()
    assert isinstance(work, Work) and [c.index for c in work.todo] == [1]


def test_run_imports_no_prefect() -> None:
    """The CLI builds a ``Run`` before Prefect starts (about 2 s of imports)."""
    code = "import sys, flows.run; assert 'prefect' not in sys.modules, 'prefect imported'"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_summaries_count_from_the_start_and_keep_the_base(tmp_path: Path, rows: list) -> None:
    run = _open(_settings(tmp_path))
    first = run.summary(status="x", exit_code=1, message="m")
    assert (first.run_key, first.rows_total, first.chunks_total) == (run.run_key, 7, 3)
    assert first.wall_s >= 0
    kept = run.summary(first, wall_s=1.5, message="n")
    assert (kept.status, kept.wall_s, kept.message) == ("x", 1.5, "n")
