"""The flow in-process against a real Prefect server: final states, task run names and the
artifacts the UI shows (progress, summary, dead letters) — with no input text in them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.forked_cli import popen_cli

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


@pytest.mark.parametrize("failed_posts", [0, 5], ids=["server-well", "burst-of-500s"])
def test_progress_artifact_close_posts_the_last_value_without_waiting_out_the_interval(
    prefect_api_url: str, failed_posts: int
) -> None:
    """close() used to wait out the poster's pause after a post (min_interval_s) and gave
    up after its own timeout, so with a long interval the last value was never posted; and
    it gave the last value three quick tries, which a busy server's burst of 500s (which
    Prefect's client does not retry) outlasted, so a finished run read 25 %."""
    import threading
    import time

    from prefect import flow
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED

    from flows.artifacts import ProgressArtifact
    from tests.support.s3_proxy import ResettingProxy

    armed = threading.Event()
    failures: list[str] = []

    def fault(method: str, path: str) -> tuple[int, bytes] | None:
        if armed.is_set() and method == "PATCH" and len(failures) < failed_posts:
            failures.append(path)
            return 500, b'{"detail": "database is locked"}'
        return None

    @flow
    def progress_flow() -> Any:
        artifact = ProgressArtifact(description="test", min_interval_s=60.0)
        artifact.update(1, 4)
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 30
            while _posted(client, artifact._id) != 25.0 and time.monotonic() < deadline:
                time.sleep(0.05)  # the poster is now in its 60 s pause
            assert _posted(client, artifact._id) == 25.0
        armed.set()
        artifact.update(4, 4)
        # well under the 60 s pause (the point), above what two posts to the busy shared
        # test server can take
        artifact.close(timeout_s=30.0)
        return artifact._id

    upstream = prefect_api_url.removesuffix("/api")
    with ResettingProxy(upstream, fault=fault) as proxy:
        through = {PREFECT_API_URL: f"{proxy.url}/api", PREFECT_LOGGING_TO_API_ENABLED: False}
        with temporary_settings(updates=through):
            artifact_id = progress_flow()
    direct = temporary_settings(updates={PREFECT_API_URL: prefect_api_url})
    with direct, get_client(sync_client=True) as client:
        assert _posted(client, artifact_id) == 100.0
    assert len(failures) == failed_posts  # the burst happened, and was outlasted


def test_a_value_shown_while_a_post_is_in_flight_is_posted_by_close(
    prefect_api_url: str,
) -> None:
    """The poster compared the value it had read before a post with what it posted, so a
    value shown during the post, with close() called before the post returned, was never
    posted: a completed run read 0 % in the UI. The post here is held in a proxy while
    the run finishes."""
    import threading
    import time

    from prefect import flow
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED

    from flows.artifacts import ProgressArtifact
    from tests.support.s3_proxy import ResettingProxy

    armed, held = threading.Event(), threading.Event()

    def hold_first_patch(method: str, path: str) -> None:
        if armed.is_set() and method == "PATCH" and not held.is_set():
            held.set()
            time.sleep(1.0)  # then forwarded: the post of 50 % returns after close()
        return None

    @flow
    def progress_flow() -> Any:
        artifact = ProgressArtifact(description="test", min_interval_s=0.0)
        armed.set()
        artifact.update(2, 4)
        assert held.wait(30)  # the poster read 50 % and is posting it
        artifact.update(4, 4)
        artifact.close(timeout_s=30.0)
        return artifact._id

    upstream = prefect_api_url.removesuffix("/api")
    with ResettingProxy(upstream, fault=hold_first_patch) as proxy:
        through = {PREFECT_API_URL: f"{proxy.url}/api", PREFECT_LOGGING_TO_API_ENABLED: False}
        with temporary_settings(updates=through):
            artifact_id = progress_flow()
    direct = temporary_settings(updates={PREFECT_API_URL: prefect_api_url})
    with direct, get_client(sync_client=True) as client:
        assert _posted(client, artifact_id) == 100.0


def _posted(client: Any, artifact_id: Any) -> Any:
    """The data of artifact ``artifact_id`` as the server holds it. By id: the server's
    default page holds 200 artifacts, and the session's server has more than that once other
    tests ran on it."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId

    only = ArtifactFilter(id=ArtifactFilterId(any_=[artifact_id]))
    (artifact,) = client.read_artifacts(artifact_filter=only)
    return artifact.data


def _progress_artifacts(client: Any, description: str) -> dict[str, Any]:
    """The progress artifacts (by key) of the flow run whose progress artifact has
    ``description``; empty until it has one."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    keys = ["embedline-progress", "embedline-progress-detail", "embedline-summary"]
    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)),
        sort=ArtifactSort.CREATED_DESC,
        limit=30,
    )
    mine = [a for a in found if a.description == description]
    if not mine:
        return {}
    run = mine[0].flow_run_id
    return {a.key: a for a in found if a.flow_run_id == run}


def test_a_cli_run_leaves_progress_with_rows_per_s_eta_and_the_charged_inputs(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    """While the run goes, the detail artifact shows rows/s and an ETA (read back through
    the Prefect client, as the UI reads it); at its end 100 %, and the summary counts the
    inputs the server charged apart from the rate-limited request, in Markdown a GFM
    renderer shows as written."""
    import os
    import subprocess
    import sys
    import time

    from markdown_it import MarkdownIt

    from tests.support.fixtures import REPO

    name = f"night-{tmp_path.name}.csv"
    (tmp_path / name).write_text("id,text\n" + "".join(f"r{i},t{i}\n" for i in range(600)))
    fake_openai.script([{"status": 429, "headers": {"retry-after-ms": "10"}}])
    fake_openai.fail_when(lambda payload: {"delay_s": 0.25})
    args = [
        *("run", name, "--embedder", "openai", "--base-url", fake_openai.base_url),
        *("--chunk-size", "200", "--batch-size", "20", "--concurrency", "1"),
        *("--price-per-million-tokens", "0.02", "--output", "out", "--ledger", "l.sqlite3"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": prefect_api_url}
    proc = popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    description = f"{name}: rows embedded and published"
    running: list[str] = []  # the detail tables seen while the run went
    with (
        temporary_settings(updates={PREFECT_API_URL: prefect_api_url}),
        get_client(sync_client=True) as client,
    ):
        while proc.poll() is None:
            detail = _progress_artifacts(client, description).get("embedline-progress-detail")
            if detail is not None and detail.data not in running:
                running.append(str(detail.data))
            time.sleep(0.3)
        out, err = proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        artifacts = _progress_artifacts(client, description)
    mid_run = [
        md
        for md in running
        if re.search(r"\| rows/s \| [\d,]+ \(last 60 s\) \|", md)
        and re.search(r"\| ETA \| [\d,]+ (s|min) \|", md)
    ]
    assert mid_run, running  # a running night shows rows/s and an ETA
    assert artifacts["embedline-progress"].data == 100.0
    final = str(artifacts["embedline-progress-detail"].data)
    assert "| rows | 600 of 600 (100.0 %) |" in final and "| ETA | done |" in final
    assert re.search(r"\| rows/s \| [\d,]+ \(last 60 s\) \|", final), final
    served = fake_openai.counters()
    assert f"| requests | {served['requests']} sent, 1 without vectors" in final, (final, served)
    summary = str(artifacts["embedline-summary"].data)
    assert f"| inputs charged | {served['inputs']:,} texts answered with vectors |" in summary
    assert "1 without vectors (20 texts: rate limited" in summary, summary
    assert "inputs charged" in out and "(1 without vectors: 20 texts not charged)" in out, out
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(summary + final)
    assert "<del>" not in html and "<s>" not in html and html.count("<table>") == 2


def test_a_run_with_a_sink_shows_the_load_and_the_index_as_their_own_progress_lines(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t{i}\n" for i in range(6)))
    state = _run_flow(
        tmp_path, fake_openai, prefect_api_url, sink=f"lancedb://{tmp_path}/lance?table=t"
    )
    assert state.is_completed(), state.message
    artifacts, _ = _artifacts_and_tasks(prefect_api_url, state.state_details.flow_run_id)
    detail = str(artifacts["embedline-progress-detail"].data)
    assert "| rows | 6 of 6 (100.0 %) |" in detail
    assert "| load | loaded: 6 upserted now, 0 held before, 0 deleted, " in detail, detail
    assert re.search(r"\| index \| .+ in [\d.]+ s \|", detail), detail
