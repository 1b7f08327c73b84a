"""The flow in-process against a real Prefect server: final states, task run names and the
artifacts the UI shows (progress, summary, dead letters) — with no input text in them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.fake_openai import FakeEmbeddingServer

pytestmark = pytest.mark.integration

SECRET_TEXT = "confidential words that must never reach the UI"


def _run_flow(tmp_path: Path, server: FakeEmbeddingServer, api_url: str, **kw: Any) -> Any:
    from embedline.parameters import grouped
    from flows.embed_csv import embed_csv

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        parameters = dict(
            input=str(tmp_path / "in.csv"),
            output=str(tmp_path / "out"),
            ledger=str(tmp_path / "ledger.sqlite3"),
            embedder="openai",
            base_url=server.base_url,
            chunk_size=2,
            chunk_retries=0,
            price_per_million_tokens=0.02,
            **kw,
        )
        return embed_csv(**grouped(parameters), return_state=True)


def _artifacts_and_tasks(api_url: str, flow_run_id: Any) -> tuple[dict[str, Any], list[str]]:
    with (
        temporary_settings(updates={PREFECT_API_URL: api_url}),
        get_client(sync_client=True) as client,
    ):
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        artifacts = {a.key: a for a in client.read_artifacts(flow_run_filter=runs) if a.key}
        tasks = [t.name for t in client.read_task_runs(flow_run_filter=runs)]
    return artifacts, tasks


def test_completed_run_has_named_chunk_tasks_and_summary_artifacts(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    (tmp_path / "in.csv").write_text(f"id,text\n1,{SECRET_TEXT}\n2,b\n3,c\n", encoding="utf-8")
    state = _run_flow(tmp_path, fake_openai, prefect_api_url)
    assert state.is_completed()
    summary = state.result()
    assert summary["exit_code"] == 0 and summary["rows_published"] == 3
    artifacts, tasks = _artifacts_and_tasks(prefect_api_url, state.state_details.flow_run_id)
    assert {"embedline-progress", "embedline-summary"} <= set(artifacts)
    assert artifacts["embedline-progress"].data == 100.0
    markdown = str(artifacts["embedline-summary"].data)
    assert "3 of 3" in markdown and summary["run_key"] in markdown
    assert "estimated cost" in markdown
    assert SECRET_TEXT not in markdown
    assert sorted(t for t in tasks if t.startswith("embed-chunk")) == [
        "embed-chunk-0000",
        "embed-chunk-0001",
    ]
    assert any(t.startswith("plan-input") for t in tasks)


def test_dead_letters_fail_the_flow_run_and_are_listed_without_text(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    (tmp_path / "in.csv").write_text(f"id,text\n1,{SECRET_TEXT}\n2,\n3,c\n", encoding="utf-8")
    state = _run_flow(tmp_path, fake_openai, prefect_api_url, on_empty_text="fail")
    assert state.is_failed()
    assert "dead letter" in (state.message or "")
    artifacts, _ = _artifacts_and_tasks(prefect_api_url, state.state_details.flow_run_id)
    table = str(artifacts["embedline-dead-letters"].data)
    assert "empty_text" in table and SECRET_TEXT not in table
    assert "not committed" in str(artifacts["embedline-summary"].data)


def test_rerun_shows_published_chunks_as_cached_task_runs_without_requests(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n1,a\n2,b\n3,c\n", encoding="utf-8")
    assert _run_flow(tmp_path, fake_openai, prefect_api_url).is_completed()
    for manifest in (tmp_path / "out" / "manifests").iterdir():
        manifest.unlink()  # not committed any more: the rerun goes through every chunk
    requests = fake_openai.counters()["requests"]
    state = _run_flow(tmp_path, fake_openai, prefect_api_url)
    assert state.is_completed() and fake_openai.counters()["requests"] == requests
    with (
        temporary_settings(updates={PREFECT_API_URL: prefect_api_url}),
        get_client(sync_client=True) as client,
    ):
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        tasks = {t.name: t.state.name for t in client.read_task_runs(flow_run_filter=runs)}
    assert tasks["embed-chunk-0000"] == "Cached" and tasks["embed-chunk-0001"] == "Cached"


def test_progress_artifact_close_posts_the_last_value_without_waiting_out_the_interval(
    prefect_api_url: str,
) -> None:
    """close() used to wait out the poster's pause after a post (min_interval_s) and gave
    up after its own timeout, so with a long interval the last value was never posted."""
    import time

    from prefect import flow
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED

    from flows.artifacts import ProgressArtifact

    def posted(client: Any, artifact_id: Any) -> Any:
        # by id: the server's default page holds 200 artifacts, and the session's
        # server has more than that once other tests ran on it
        only = ArtifactFilter(id=ArtifactFilterId(any_=[artifact_id]))
        (artifact,) = client.read_artifacts(artifact_filter=only)
        return artifact.data

    @flow
    def progress_flow() -> Any:
        artifact = ProgressArtifact(description="test", min_interval_s=60.0)
        artifact.update(1, 4)
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 30
            while posted(client, artifact._id) != 25.0 and time.monotonic() < deadline:
                time.sleep(0.05)  # the poster is now in its 60 s pause
            assert posted(client, artifact._id) == 25.0
        artifact.update(4, 4)
        artifact.close(timeout_s=5.0)
        return artifact._id

    with temporary_settings(
        updates={PREFECT_API_URL: prefect_api_url, PREFECT_LOGGING_TO_API_ENABLED: False}
    ):
        artifact_id = progress_flow()
        with get_client(sync_client=True) as client:
            assert posted(client, artifact_id) == 100.0
