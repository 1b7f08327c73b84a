"""Chunk task runs sized to the work (tasks/embed/groups.py), the flow against a real Prefect
server: a night whose many chunks each have a little to send runs them in a few group task
runs, publishes every chunk exactly, and a retry of a group sends only its failed chunk."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.output import vectors_by_id

pytestmark = pytest.mark.integration

CHUNK_SIZE = 5
CHUNKS = 12
FAILING = "edited 37"  # the edited text of chunk 7: its first request fails once


def _write(path: Path, edited: bool) -> list[tuple[str, str]]:
    rows = [
        (f"id{i}", f"edited {i}" if edited and i % CHUNK_SIZE == 2 else f"text number {i}")
        for i in range(CHUNK_SIZE * CHUNKS)
    ]
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows), encoding="utf-8")
    return rows


def _run(tmp_path: Path, server: FakeEmbeddingServer, api_url: str, **kw: Any) -> Any:
    from embedline.parameters import grouped
    from flows.embed_csv import embed_csv

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        parameters = dict(
            input=str(tmp_path / "in.csv"),
            output=str(tmp_path / "out"),
            ledger=str(tmp_path / "ledger.sqlite3"),
            embedder="openai",
            base_url=server.base_url,
            chunk_size=CHUNK_SIZE,
            concurrency=2,  # 3 task runs at once: at least 3 groups
            max_attempts=1,
            chunk_retries=1,
            chunk_retry_delay=0,
            **kw,
        )
        return embed_csv(**grouped(parameters), return_state=True)


def _task_runs(api_url: str, flow_run_id: Any, expect: int) -> dict[str, str]:
    """The flow run's task runs by name -> state name, once ``expect`` embed-chunk task runs
    are final (Prefect records task runs from their events, a moment after the flow
    returns), or whatever is there after 30 s."""
    deadline = time.monotonic() + 30
    with (
        temporary_settings(updates={PREFECT_API_URL: api_url}),
        get_client(sync_client=True) as client,
    ):
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        while True:
            found = client.read_task_runs(flow_run_filter=runs)
            tasks = {t.name: str(t.state.name) for t in found if t.state is not None}
            final = [
                t
                for t in found
                if t.name.startswith("embed-chunk") and t.state and t.state.is_final()
            ]
            if len(final) >= expect or time.monotonic() > deadline:
                return tasks
            time.sleep(0.2)


def test_a_night_of_small_edits_runs_few_task_runs_and_publishes_every_chunk_exactly(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    _write(tmp_path / "in.csv", edited=False)
    first = _run(tmp_path, fake_openai, prefect_api_url)
    assert first.is_completed()
    tasks = _task_runs(prefect_api_url, first.state_details.flow_run_id, expect=CHUNKS)
    assert sorted(t for t in tasks if t.startswith("embed-chunk")) == [
        f"embed-chunk-{i:04d}" for i in range(CHUNKS)
    ]  # each chunk full of rows to send: a task run of its own

    # ── the night: one row of each chunk edited, the rest copied; one request fails once.
    # A full night (--compact): a delta night would write the 12 edited rows as one chunk ──
    rows = _write(tmp_path / "in.csv", edited=True)
    fake_openai.reset()
    failed: list[int] = []

    def fail_once(payload: Any) -> dict[str, int] | None:
        if FAILING in payload.get("input", []) and not failed:
            failed.append(1)
            return {"status": 503}
        return None

    fake_openai.fail_when(fail_once)
    state = _run(tmp_path, fake_openai, prefect_api_url, compact=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["rows_published"] == len(rows) and summary["rows_reused"] == 48

    tasks = _task_runs(prefect_api_url, state.state_details.flow_run_id, expect=3)
    chunk_runs = {n: s for n, s in tasks.items() if n.startswith("embed-chunk")}
    # 12 chunks of one row to send each: groups of 5 rows to send, 3 task runs
    assert chunk_runs == {
        "embed-chunks-0000-0004": "Completed",
        "embed-chunks-0005-0009": "Completed",  # after its retry
        "embed-chunks-0010-0011": "Completed",
    }
    assert failed == [1]
    charged = fake_openai.charged_texts()
    assert sum(charged.values()) == CHUNKS and set(charged.values()) == {1}  # the retry sent
    # only the failed chunk's row: the group's published chunks were not run again

    manifest_path = tmp_path / "out" / "manifests" / f"{summary['run_key']}.json"
    manifest = json.loads(manifest_path.read_text())
    out = tmp_path / "out"
    bodies = {e["object"]: (out / e["object"]).read_bytes() for e in manifest["chunks"]}
    vectors = vectors_by_id(bodies, manifest)
    assert sorted(vectors) == sorted(i for i, _ in rows)
    for row_id, text in rows:
        assert (vectors[row_id] == expected_vector(text)).all(), row_id
