"""``--batch-api``: the flow in-process (and the CLI for ``kill -9``) against the fake Batch
API (``tests/support/fake_batch.py``), whose vectors are the fake embeddings server's
deterministic ones: exact vectors, nothing paid twice, adoption of a create that failed
after creating, partial outcomes, the token limit, validation failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.bounded import write_csv
from tests.support.fake_batch import FakeBatchServer
from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.output import read_local_output

pytestmark = pytest.mark.integration

DIMS = 8


@pytest.fixture(scope="module")
def running_batch_server() -> Iterator[FakeBatchServer]:
    with FakeBatchServer(dims=DIMS, complete_after_s=0.1) as server:
        yield server


@pytest.fixture
def server(running_batch_server: FakeBatchServer) -> Iterator[FakeBatchServer]:
    yield running_batch_server
    running_batch_server.reset_batches()  # the batch API's faults and counters too


TEXTS = [f"text number {i} about batches" for i in range(10)] + [
    "text number 1 about batches",  # a duplicate of row 1 (another chunk)
    "",  # an empty text: never sent
]


#: ``--batch-max-inputs`` that packs no two chunks of ``TEXTS`` (4 rows each) in one batch.
ONE_CHUNK_EACH = 4
PACKED = 50_000  # the default: as many chunks as the provider's limits allow


def run_flow(tmp_path: Path, server: FakeBatchServer, api_url: str, **kw: Any) -> dict[str, Any]:
    from embedline.parameters import grouped
    from flows.embed_csv import embed_csv

    options: dict[str, Any] = dict(
        input=str(tmp_path / "in.csv"),
        output=str(tmp_path / "out"),
        ledger=str(tmp_path / "ledger.sqlite3"),
        embedder="openai",
        base_url=server.base_url,
        chunk_size=4,
        batch_size=2,
        chunk_retries=0,
        batch_api=True,
        batch_poll_interval=0.1,
        price_per_million_tokens=0.02,
    )
    if kw.get("batch_api", True):
        # one chunk's part per batch (chunks of TEXTS send at most 4 inputs): the scenarios
        # below need several batches; the tests of packing give the default
        options["batch_max_inputs"] = ONE_CHUNK_EACH
    options.update(kw)
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        state = embed_csv(**grouped(options), return_state=True)
    summary = state.result(raise_on_failure=False)
    return getattr(summary, "summary", summary)  # type: ignore[no-any-return]


def assert_exact(tmp_path: Path, rows: list[tuple[str, str]], output: str | None = None) -> None:
    """Every non-empty row's vector is the fake's for its text (``output``: an s3:// root,
    read through ``read_embeddings``; else ``tmp_path / "out"``)."""
    if output is None:
        _, vectors = read_local_output(tmp_path / "out")
    else:
        from embedline import read_embeddings

        frame = read_embeddings(output)
        vectors = dict(zip(frame["id"], frame["embedding"], strict=True))
    expected = {i: t for i, t in rows if t.strip()}
    assert set(vectors) == set(expected)
    for row_id, text in expected.items():
        np.testing.assert_allclose(vectors[row_id], expected_vector(text, DIMS), rtol=1e-6)


def distinct(rows: list[tuple[str, str]]) -> int:
    return len({t for _, t in rows if t.strip()})


def test_batch_mode_publishes_exact_vectors_with_no_synchronous_request(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    summary = run_flow(tmp_path, server, prefect_api_url, batch_max_inputs=PACKED)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["requests"] == 0  # no synchronous request
    assert counters["batch_inputs"] == distinct(rows)  # each distinct text paid once
    assert counters["creates"] == counters["batches"] == 1  # the three chunks packed in one
    assert summary["batches"] == 1
    assert summary["batch_tokens"] == summary["tokens"] > 0
    assert summary["inputs"] == summary["batch_inputs"] == distinct(rows)  # before: 0 sent
    # a rerun has nothing to do: no batch, no request
    assert run_flow(tmp_path, server, prefect_api_url, batch_max_inputs=PACKED)["exit_code"] == 0
    assert server.batch_counters()["creates"] == 1


def test_a_create_that_fails_after_creating_is_adopted_not_duplicated(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    server.create_fails_after_creating = 2  # two creates answer 500 after making the batch
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == counters["batches"] == 3  # adopted: never sent again
    assert counters["batch_inputs"] == distinct(rows)


def test_an_expired_batch_publishes_what_completed_and_resubmits_only_the_rest(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows = write_csv(tmp_path / "in.csv", TEXTS[:4])  # one chunk: 2 requests of 2 inputs
    server.expire_after = 1  # a batch runs its first request, then expires
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    batches = sorted(server.batches.values(), key=lambda b: b["id"])
    assert [b["status"] for b in batches] == ["expired", "completed"]
    assert [b["request_counts"]["total"] for b in batches] == [2, 1]  # only the rest
    assert server.batch_counters()["batch_inputs"] == distinct(rows)
    assert server.batch_counters()["requests"] == 0


def test_completed_with_a_null_output_file_reads_the_error_file(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows = write_csv(
        tmp_path / "in.csv", ["bad one MARK", "bad two MARK", "good three", "good four"]
    )
    server.reject_texts_containing = "MARK"  # each of these requests is a 400 in the batch
    server.output_id_race = 1  # and the first poll of a finished batch has no file ids yet
    summary = run_flow(
        tmp_path, server, prefect_api_url, batch_size=1, chunk_size=2, batch_max_inputs=2
    )
    assert server.output_id_race == 0  # a poll saw `completed` without file ids: polled again
    first = min(server.batches.values(), key=lambda b: b["id"])
    assert first["status"] == "completed" and first["output_file_id"] is None
    assert first["error_file_id"] is not None
    assert (summary["exit_code"], summary["status"]) == (1, "dead_letters"), summary["message"]
    assert summary["rows_failed"] == 2 and summary["rows_published"] == 2
    assert server.batch_counters()["requests"] == 0
    assert not (tmp_path / "out" / "manifests").exists() or not list(
        (tmp_path / "out" / "manifests").iterdir()
    )  # dead letters block the commit
    assert len(rows) == 4


def test_token_limit_waits_for_earlier_batches_and_submits_again(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    server.enqueued_token_limit = 25  # about one chunk's batch at a time
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    statuses = [
        b["errors"]["data"][0]["code"] for b in server.batches.values() if b["status"] == "failed"
    ]
    assert statuses and set(statuses) == {"token_limit_exceeded"}
    assert server.batch_counters()["batch_inputs"] == distinct(rows)


def test_a_batch_that_fails_validation_stops_the_run_with_exit_3(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    write_csv(tmp_path / "in.csv", TEXTS)
    server.validation_error = "The model 'text-embedding-9' does not exist"
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 3
    assert "does not exist" in summary["message"]
    assert server.batch_counters()["creates"] == 1  # nothing more submitted
    assert server.batch_counters()["batch_inputs"] == 0


def test_fake_batch_api_answers_match_the_openai_sdk_types(
    tmp_path: Path, server: FakeBatchServer
) -> None:
    from openai.types import Batch, FileObject

    from adapters.embeddings.openai_batch import BatchClient

    client = BatchClient(base_url=server.base_url, api_key="sk-test")
    line = (
        b'{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":'
        b'{"model":"text-embedding-3-small","input":["x y"]}}\n'
    )
    file_id = client.upload("in.jsonl", line)
    FileObject.model_validate(server.files[file_id])
    created = client.create_batch(file_id, {"embedline_run": "r"})
    Batch.model_validate(created)
    deadline = time.monotonic() + 5
    while (batch := client.get_batch(created["id"]))["status"] != "completed":
        Batch.model_validate(batch)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    Batch.model_validate(batch)
    assert batch["usage"]["total_tokens"] == 2
    listed = list(client.list_batches(page_size=1))
    assert [b["id"] for b in listed][:1] == [created["id"]]
    for b in listed:
        Batch.model_validate(b)
    cancelled = client.cancel_batch(created["id"])
    Batch.model_validate(cancelled)
    client.close()


def cli_args(tmp_path: Path, server: FakeBatchServer) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli",
        "run",
        str(tmp_path / "in.csv"),
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--chunk-size",
        "4",
        "--batch-size",
        "2",
        "--batch-api",
        "--batch-poll-interval",
        "0.1",
        "--batch-max-inputs",
        str(ONE_CHUNK_EACH),
    ]


def start_waiting_run(
    tmp_path: Path,
    server: FakeBatchServer,
    api_url: str,
    *extra: str,
    batches: int = 3,
) -> tuple[list[tuple[str, str]], dict[str, str], subprocess.Popen[str]]:
    """A CLI run of ``TEXTS`` (on the Prefect server at ``api_url``) whose ``batches``
    batches are submitted and held ``in_progress``: it waits. Returns (rows, env, process)."""
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": api_url}
    server.hold = True
    proc = subprocess.Popen(
        [*cli_args(tmp_path, server), *extra],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while server.batch_counters()["batches"] < batches:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never submitted its batches"
        time.sleep(0.1)
    time.sleep(0.3)  # polling now
    return rows, env, proc


@pytest.mark.slow  # two CLI runs (~10 s): beyond the CI budget; `pytest -m slow`
def test_ctrl_c_leaves_batches_running_status_lists_them_cancel_batches_cancels(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows, env, proc = start_waiting_run(tmp_path, server, prefect_api_url)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "status     interrupted: interrupted by SIGINT" in stdout, stdout  # the summary
    assert "3 batches keep running at the provider" in stderr
    assert "cancel-batches" in stderr
    assert all(b["status"] == "in_progress" for b in server.batches.values())
    ledger = ["--ledger", str(tmp_path / "ledger.sqlite3")]
    cli = [sys.executable, "-m", "cli"]
    status = subprocess.run(
        [*cli, "status", *ledger], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=60
    )
    run_key = status.stdout.split("\t")[0]
    status = subprocess.run(
        [*cli, "status", run_key, *ledger],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    batch_lines = [line for line in status.stdout.splitlines() if line.startswith("batch\t")]
    assert len(batch_lines) == 3 and all("\tin_progress\t" in b for b in batch_lines)
    cancel = subprocess.run(
        [*cli, "cancel-batches", run_key[:12], *ledger],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert cancel.returncode == 0, cancel.stderr
    assert all(b["status"] == "cancelling" for b in server.batches.values())
    server.hold = False
    rerun = subprocess.run(
        cli_args(tmp_path, server),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    # each cancelled batch delivered half its requests; only the rest went in new batches,
    # the rests of several chunks packed together (within --batch-max-inputs 4)
    assert counters["creates"] == counters["batches"] == 5
    assert counters["batch_inputs"] == distinct(rows)
    assert counters["requests"] == 0


def test_kill_9_while_waiting_then_rerun_creates_no_batch_and_pays_nothing_twice(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows, env, proc = start_waiting_run(tmp_path, server, prefect_api_url)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    server.hold = False
    args = cli_args(tmp_path, server)
    rerun = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == counters["batches"] == 3  # nothing submitted again
    assert counters["batch_inputs"] == distinct(rows)  # nothing paid twice
    assert counters["requests"] == 0


def test_fallback_sync_sends_only_what_the_expired_batch_left(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows = write_csv(tmp_path / "in.csv", TEXTS[:4])  # one chunk: 2 requests of 2 inputs
    server.expire_after = 1
    summary = run_flow(tmp_path, server, prefect_api_url, batch_fallback="sync")
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == 1  # no second batch: the rest went synchronously
    assert counters["requests"] == 1 and server.counters()["inputs"] == 2
    assert counters["batch_inputs"] + server.counters()["inputs"] == distinct(rows)
    assert 0 < summary["batch_tokens"] < summary["tokens"]


def test_a_server_error_in_the_error_file_is_submitted_again(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    rows = write_csv(tmp_path / "in.csv", [*TEXTS[:3], "flaky MARK text"])
    server.batch_texts_fail, server.batch_texts_fail_times = {"MARK": 500}, 1
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    batches = sorted(server.batches.values(), key=lambda b: b["id"])
    assert [b["request_counts"]["total"] for b in batches] == [2, 1]
    assert server.batch_counters()["batch_inputs"] == distinct(rows)


class Crash(BaseException):
    """A process dying between a batch's create and the ledger's record of it."""


def test_a_crash_right_after_a_create_is_adopted_by_the_rerun(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adapters.embeddings.openai_batch import BatchClient

    rows = write_csv(tmp_path / "in.csv", TEXTS)
    real_create = BatchClient.create_batch
    calls: list[int] = []

    def create_then_die(self: BatchClient, *args: Any, **kwargs: Any) -> dict[str, Any]:
        batch = real_create(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            raise Crash("killed after the provider created the batch")
        return batch

    monkeypatch.setattr(BatchClient, "create_batch", create_then_die)
    with pytest.raises(Crash):
        run_flow(tmp_path, server, prefect_api_url)
    monkeypatch.setattr(BatchClient, "create_batch", real_create)
    from adapters.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger.sqlite3")
    assert [r.state for r in ledger.run_batches(ledger.runs()[0].run_key)] == [
        "submitted",
        "creating",
        "creating",
    ]  # the second part's batch exists, unrecorded; the third's was not created
    ledger.close()
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == counters["batches"] == 3  # adopted, not created again
    assert counters["batch_inputs"] == distinct(rows)


def test_a_server_without_a_batch_api_stops_the_run_with_exit_3_saying_so(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    write_csv(tmp_path / "in.csv", TEXTS)
    summary = run_flow(tmp_path, fake_openai, prefect_api_url)  # type: ignore[arg-type]
    assert summary["exit_code"] == 3 and summary["status"] == "fatal", summary
    # its first call, the list of the run's batches, is answered by no batch list
    assert (
        "has no Batch API (GET /batches: no batch list): run without --batch-api"
        in (summary["message"])
    )
    assert fake_openai.log == []  # nothing uploaded, nothing embedded


@pytest.mark.parametrize(
    "changed",
    [
        # the rerun's requests would be other ones (3 inputs each, parts of at most 2 inputs),
        # and each batch expired after its first request: only the rest is submitted again
        {"batch_size": 3, "batch_max_inputs": 2, "expire": True},
        # one input per request, with the synchronous fallback (before: it paid them all again)
        {"batch_size": 1, "batch_fallback": "sync"},
        # the same settings, the parts recorded by a ledger before 0010_batch_layouts (no
        # layout): derived from the run's settings, as they were
        {"legacy": True, "expire": True},
    ],
    ids=["batch-size-and-max-inputs", "batch-size-fallback-sync", "recorded-before-layouts"],
)
def test_a_rerun_with_other_batching_settings_collects_the_batches_and_pays_nothing_twice(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str, changed: dict[str, Any]
) -> None:
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    server.hold, server.poll_status = True, 503  # submitted, then the API goes away
    first = run_flow(tmp_path, server, prefect_api_url, max_attempts=1)
    assert first["exit_code"] == 1, first["message"]
    assert server.batch_counters()["creates"] == 3
    server.hold, server.poll_status = False, None
    server.expire_after = 1 if changed.pop("expire", False) else None
    if changed.pop("legacy", False):
        import sqlite3

        with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
            db.execute("UPDATE batches SET layout = NULL")
    summary = run_flow(tmp_path, server, prefect_api_url, **changed)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["batch_inputs"] == distinct(rows)  # nothing paid twice
    assert counters["requests"] == 0  # nothing sent synchronously
    # the expired batches' unanswered requests went again as they were: one more batch for
    # each chunk with two requests; none else
    assert counters["creates"] == (5 if server.expire_after else 3)
    assert summary["inputs"] == distinct(rows)


def test_cancel_batches_adopts_a_batch_still_recorded_creating_and_cancels_it(
    tmp_path: Path,
    server: FakeBatchServer,
    prefect_api_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from adapters.ledger import Ledger
    from cli.main import main

    write_csv(tmp_path / "in.csv", TEXTS[:4])  # one chunk, one batch
    # the create makes the batch but answers 500, and the list that would find it fails:
    # the run stops with the batch running and its part recorded `creating`
    server.create_fails_after_creating, server.list_status, server.hold = 1, 503, True
    server.list_status_after = 1  # the list before the create answers (nothing there yet)
    first = run_flow(tmp_path, server, prefect_api_url, max_attempts=1)
    assert first["exit_code"] == 1, first["message"]
    ledger_path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(ledger_path)
    run_key = ledger.runs()[0].run_key
    assert [r.state for r in ledger.run_batches(run_key)] == ["creating"]
    ledger.close()
    (batch,) = server.batches.values()
    assert batch["status"] in ("validating", "in_progress")
    server.list_status = None
    capsys.readouterr()
    assert main(["cancel-batches", run_key[:12], "--ledger", str(ledger_path)]) == 0
    out = capsys.readouterr()
    assert batch["status"] == "cancelling", out  # before: skipped, left running
    assert f"{batch['id']}\tcancelling" in out.out
    ledger = Ledger(ledger_path)  # adopted: the rerun polls it, submits nothing
    (record,) = ledger.run_batches(run_key)
    ledger.close()
    assert (record.state, record.batch_id) == ("submitted", batch["id"])


def test_sigterm_while_waiting_prints_the_summary_and_how_to_cancel_with_batch_progress(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    """The lighter sibling of the slow Ctrl-C test: one CLI run, stopped while it waits."""
    _, _env, proc = start_waiting_run(
        tmp_path, server, prefect_api_url, "--progress-interval", "0.2"
    )
    time.sleep(0.5)  # a progress line or two while waiting
    os.killpg(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    # the usual summary on stdout (before: nothing, only a line on stderr)
    assert "status     interrupted" in stdout, stdout
    assert "chunks     0 published now" in stdout and "3 not run, of 3" in stdout
    assert "batch      3 Batch API batches" in stdout
    last = stderr.strip().splitlines()[-1]
    assert "3 batches keep running at the provider" in last, stderr[-2000:]
    assert "embedline cancel-batches " in last
    # the progress lines show the batches by status with their request counts
    assert "; batches 3 in_progress (0 of 5 requests done)" in stderr, stderr[-3000:]
    assert all(b["status"] == "in_progress" for b in server.batches.values())


def test_batch_mode_publishes_to_s3(
    tmp_path: Path,
    server: FakeBatchServer,
    prefect_api_url: str,
    moto_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    output = f"s3://{s3_bucket}/batch"
    server.expire_after = 1  # and the chunks with two requests need a second batch
    summary = run_flow(tmp_path, server, prefect_api_url, output=output)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows, output)
    counters = server.batch_counters()
    assert counters["batch_inputs"] == distinct(rows) == summary["inputs"]
    assert (counters["requests"], counters["creates"]) == (0, 5)
    assert run_flow(tmp_path, server, prefect_api_url, output=output)["exit_code"] == 0
    assert server.batch_counters()["creates"] == 5  # the rerun submits nothing


@pytest.mark.slow  # a Dask cluster in a CLI run: ~40 s; test_batch_mode_publishes_to_s3 is its
# lighter sibling in CI (S3, threads)
def test_batch_mode_on_dask_workers_with_s3_output(
    tmp_path: Path,
    server: FakeBatchServer,
    prefect_api_url: str,
    moto_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunk tasks on Dask worker processes read their batches' result files themselves
    (no shared memory with the flow process: the recorded layouts travel with the task)."""
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("PREFECT_API_URL", prefect_api_url)
    output = f"s3://{s3_bucket}/dask"
    args = [
        *cli_args(tmp_path, server)[3:],
        "--output",
        output,
        "--task-runner",
        "dask",
        "--dask-workers",
        "2",
    ]
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # counted on Dask too (from the chunks' outcomes: the workers' counts stay there)
    assert (
        f"api        0 requests, {distinct(rows)} inputs charged ({distinct(rows)} of them in "
        "Batch API batches)"
    ) in result.stdout, result.stdout
    assert_exact(tmp_path, rows, output)
    counters = server.batch_counters()
    assert counters["batch_inputs"] == distinct(rows)
    assert (counters["requests"], counters["creates"]) == (0, 3)


# -- the ways a batch-mode run, cancel-batches and status end (issue 26 review) ----------


def _run_key(tmp_path: Path) -> str:
    from adapters.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger.sqlite3")
    try:
        return ledger.runs()[0].run_key
    finally:
        ledger.close()


def _submitted_then_lost(
    tmp_path: Path, server: FakeBatchServer, api_url: str, texts: list[str]
) -> dict[str, Any]:
    """A run whose batches are submitted and held, then the API goes away (503, one
    attempt): it stops with its batches running at the provider. Its summary."""
    write_csv(tmp_path / "in.csv", texts)
    server.hold, server.poll_status = True, 503
    first = run_flow(tmp_path, server, api_url, max_attempts=1)
    assert first["exit_code"] == 1, first["message"]
    server.poll_status = None
    return first


def test_a_run_that_stops_with_batches_running_says_so_and_how_to_collect_or_cancel(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    """Failed (the API gone while waiting: exit 1) or stopped by a batch that failed
    validation while another still runs (exit 3): the last line says the batches keep
    running, and both ways on: rerun to collect them, or cancel-batches. Before, only an
    interrupt said so."""
    first = _submitted_then_lost(tmp_path, server, prefect_api_url, TEXTS)
    message = first["message"]
    assert "3 batches keep running at the provider" in message, message
    assert "rerun the same command to collect them" in message
    assert f"embedline cancel-batches {first['run_key'][:12]}" in message
    assert "\n" not in message

    other = tmp_path / "other"
    other.mkdir()
    server.reset_batches()
    write_csv(other / "in.csv", TEXTS)
    server.hold = True  # chunk 0's batch runs on; chunk 1's fails validation
    server.validation_error, server.validation_error_after = "input is not valid", 1
    stopped = run_flow(other, server, prefect_api_url)
    assert stopped["exit_code"] == 3, stopped["message"]
    assert "failed validation: invalid_request: input is not valid" in stopped["message"]
    assert "1 batch keeps running at the provider" in stopped["message"], stopped["message"]
    assert "embedline cancel-batches" in stopped["message"]


def test_a_batch_unknown_to_the_provider_is_one_line_and_exit_3_in_a_run_cancel_and_status(
    tmp_path: Path,
    server: FakeBatchServer,
    prefect_api_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The ledger records a batch another API key made (or one the provider purged): 404.
    Before: "HTTP 404: model 'batch' or URL path … not found; check --model" in a run, "has
    no Batch API … run without --batch-api" from cancel-batches."""
    from cli.main import main

    server.owner_scoped = True
    monkeypatch.setenv("EMBEDLINE_API_KEY", "sk-first-account")
    _submitted_then_lost(tmp_path, server, prefect_api_url, TEXTS[:4])  # one chunk, one batch
    (batch,) = server.batches.values()
    run_key = _run_key(tmp_path)
    monkeypatch.setenv("EMBEDLINE_API_KEY", "sk-another-account")
    summary = run_flow(tmp_path, server, prefect_api_url, max_attempts=1)
    assert (summary["exit_code"], summary["status"]) == (3, "fatal"), summary["message"]
    message = summary["message"]
    assert f"batch {batch['id']} " in message and "HTTP 404" in message, message
    assert "the API key and --base-url that created it" in message, message
    assert "without --batch-api" in message
    assert "check --model" not in message and "sk-" not in message and "\n" not in message
    assert batch["status"] in ("validating", "in_progress")  # it runs on, under its key
    assert server.batch_counters()["creates"] == 1  # nothing resubmitted

    ledger = ["--ledger", str(tmp_path / "ledger.sqlite3")]
    capsys.readouterr()
    assert main(["cancel-batches", run_key[:12], *ledger]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and batch["id"] in err[0] and "HTTP 404" in err[0], err
    assert "the API key that created it" in err[0] and "Traceback" not in err[0]
    assert batch["status"] in ("validating", "in_progress")  # not cancelled under the wrong key

    assert main(["status", run_key[:12], *ledger]) == 0
    (line,) = [b for b in capsys.readouterr().out.splitlines() if b.startswith("batch\t")]
    assert f"\t{batch['id']}\t" in line and "\tnot_found\t" in line, line
    assert "unknown to the provider" in line, line

    monkeypatch.setenv("EMBEDLINE_API_KEY", "sk-first-account")  # the key that made it
    assert main(["cancel-batches", run_key[:12], *ledger]) == 0
    assert batch["status"] == "cancelling"


def test_a_deleted_result_file_stops_the_run_with_exit_3_naming_it(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    import httpx

    _submitted_then_lost(tmp_path, server, prefect_api_url, TEXTS[:4])
    (batch,) = server.batches.values()
    server.hold = False
    with httpx.Client(base_url=server.base_url) as http:  # done while nobody was polling
        while http.get(f"/batches/{batch['id']}").json()["status"] != "completed":
            time.sleep(0.05)
        output = batch["output_file_id"]
        assert http.delete(f"/files/{output}").json()["deleted"] is True  # by a retention job
    summary = run_flow(tmp_path, server, prefect_api_url, max_attempts=1)
    assert (summary["exit_code"], summary["status"]) == (3, "fatal"), summary["message"]
    message = summary["message"]
    assert f"file {output} " in message and "HTTP 404" in message, message
    assert "check --model" not in message and "\n" not in message
    assert server.batch_counters()["creates"] == 1  # nothing paid again behind the user's back


@pytest.mark.parametrize(
    "option",
    [
        ["--batch-poll-interval", "5"],
        ["--batch-max-inputs", "10"],
        ["--batch-fallback", "sync"],
        ["--batch-enqueued-tokens", "1000"],
    ],
    ids=lambda o: o[0],
)
def test_a_batch_option_without_batch_api_is_a_usage_error(
    tmp_path: Path, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    write_csv(tmp_path / "in.csv", TEXTS)
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "run",
                str(tmp_path / "in.csv"),
                "--embedder",
                "openai",
                "--output",
                str(tmp_path / "out"),
                "--ledger",
                str(tmp_path / "ledger.sqlite3"),
                *option,
            ]
        )
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"embedline run: error: argument {option[0]}: needs --batch-api "
        "(see 'embedline run --help')"
    ), line
    assert not (tmp_path / "ledger.sqlite3").exists()  # refused before anything started


def test_a_batch_parameter_without_batch_api_is_refused_by_the_flow(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    """The deployment's parameters: the same check (before: silently ignored)."""
    write_csv(tmp_path / "in.csv", TEXTS)
    summary = run_flow(
        tmp_path,
        server,
        prefect_api_url,
        batch_api=False,
        batch_poll_interval=None,
        batch_fallback="sync",
    )
    assert (summary["exit_code"], summary["status"]) == (2, "input_error"), summary
    assert "batch_fallback needs batch_api" in summary["message"], summary["message"]
    assert server.counters()["requests"] == 0


def test_cancel_batches_of_a_run_without_running_batches_says_there_is_nothing_to_cancel(
    tmp_path: Path,
    server: FakeBatchServer,
    prefect_api_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.main import main

    write_csv(tmp_path / "in.csv", TEXTS)
    assert (
        run_flow(tmp_path, server, prefect_api_url, batch_api=False, batch_poll_interval=None)[
            "exit_code"
        ]
        == 0
    )
    run_key = _run_key(tmp_path)
    capsys.readouterr()
    assert main(["cancel-batches", run_key[:12], "--ledger", str(tmp_path / "ledger.sqlite3")]) == 0
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line == (
        f"embedline: run {run_key[:12]} has no Batch API batches (it ran without "
        "--batch-api): nothing to cancel"
    ), line
    assert captured.out == ""

    done = tmp_path / "done"  # a batch-mode run whose 3 batches all completed
    done.mkdir()
    write_csv(done / "in.csv", TEXTS)
    assert run_flow(done, server, prefect_api_url)["exit_code"] == 0
    assert (
        main(["cancel-batches", _run_key(done)[:12], "--ledger", str(done / "ledger.sqlite3")]) == 0
    )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("has no batch running at the provider (3 ended): nothing to cancel")
    assert server.batch_counters()["creates"] == 3


def test_nothing_listening_at_base_url_in_batch_mode_stops_the_run_like_synchronous_mode(
    tmp_path: Path, prefect_api_url: str
) -> None:
    """Exit 3, one line, no traceback (before: exit 1, "cannot connect …" as an outage)."""
    import socket

    write_csv(tmp_path / "in.csv", TEXTS)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    result = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
        "--batch-api",
        "--max-attempts",
        "2",
        "--ledger",
        "ledger.sqlite3",
        "--output",
        "out",
        cwd=tmp_path,
        env={"PREFECT_API_URL": prefect_api_url},
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "no request of this run ever reached it" in last, last
    assert "check that the server is running and --base-url is right" in last
    cancel = run_cli(
        "cancel-batches", _run_key(tmp_path)[:12], "--ledger", "ledger.sqlite3", cwd=tmp_path
    )
    # the ledger records no batch, which a lost ledger would not either: only the provider
    # can say, and it refuses every connection: one line, exit 3
    assert cancel.returncode == 3, cancel.stderr
    assert "Traceback" not in cancel.stderr
    assert "check that the server is running and --base-url is right" in cancel.stderr


# -- a ledger is a cache: the provider's batches are found without it ---------------------


def test_kill_9_then_a_rerun_with_the_ledger_deleted_adopts_the_providers_batches(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    """A run killed while its batch runs, its ledger deleted (a fresh container), rerun: the
    rerun finds the run's batch in the provider's list by its metadata (the range of chunks
    it packs) and adopts it for each chunk whose lines it holds; no batch is created again,
    each distinct text billed once."""
    packed = ("--batch-max-inputs", str(PACKED))  # the three chunks in one batch
    rows, env, proc = start_waiting_run(tmp_path, server, prefect_api_url, *packed, batches=1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for leftover in tmp_path.glob("ledger.sqlite3*"):
        leftover.unlink()
    server.hold = False
    rerun = subprocess.run(
        [*cli_args(tmp_path, server), *packed],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == counters["batches"] == 1  # adopted, not created again
    assert counters["batch_inputs"] == distinct(rows)  # before: every text billed twice
    assert counters["requests"] == 0


def test_a_fresh_ledger_adopts_batches_made_with_other_batching_settings_exactly(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    """The batches a lost ledger's run made are matched by the requests their input files
    carry, not by today's settings: a rerun with another --batch-size collects them and
    pays nothing twice."""
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    server.hold, server.poll_status = True, 503
    first = run_flow(tmp_path, server, prefect_api_url, max_attempts=1)
    assert first["exit_code"] == 1, first["message"]
    server.hold, server.poll_status = False, None
    for leftover in tmp_path.glob("ledger.sqlite3*"):
        leftover.unlink()
    summary = run_flow(tmp_path, server, prefect_api_url, batch_size=3)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == counters["batches"] == 3
    assert counters["batch_inputs"] == distinct(rows)


def test_cancel_batches_finds_the_runs_batches_at_the_provider_with_a_fresh_ledger(
    tmp_path: Path,
    server: FakeBatchServer,
    prefect_api_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """cancel-batches with a ledger that records the run but none of its batches, and with
    no ledger at all (``--base-url``): the run's running batches are found in the
    provider's list by their metadata and cancelled."""
    from adapters.ledger import Ledger
    from cli.main import main

    write_csv(tmp_path / "in.csv", TEXTS)
    first = _submitted_then_lost(tmp_path, server, prefect_api_url, TEXTS)
    run_key = first["run_key"]
    assert len(server.batches) == 3
    ledger_path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(ledger_path)  # a ledger that lost the run's batches
    ledger._conn.execute("DELETE FROM batches")
    ledger._conn.commit()
    ledger.close()
    capsys.readouterr()
    assert main(["cancel-batches", run_key[:12], "--ledger", str(ledger_path)]) == 0
    out = capsys.readouterr()
    assert all(b["status"] == "cancelling" for b in server.batches.values()), out
    assert len([line for line in out.out.splitlines() if "\tcancelling" in line]) == 3

    server.reset_batches()  # again, with no ledger at all
    other = tmp_path / "other"
    other.mkdir()
    first = _submitted_then_lost(other, server, prefect_api_url, TEXTS)
    for leftover in other.glob("ledger.sqlite3*"):
        leftover.unlink()
    capsys.readouterr()
    missing = str(other / "ledger.sqlite3")
    with pytest.raises(SystemExit) as no_ledger:  # without --base-url: where to look?
        main(["cancel-batches", first["run_key"][:12], "--ledger", missing])
    assert no_ledger.value.code == 2
    assert (
        main(
            [
                "cancel-batches",
                first["run_key"][:12],
                "--ledger",
                missing,
                "--base-url",
                server.base_url,
            ]
        )
        == 0
    )
    assert all(b["status"] == "cancelling" for b in server.batches.values())
    assert "3 batches of run" in capsys.readouterr().err


# -- packing: a night of small edits over many chunks makes a few batches -----------------


def test_450_texts_over_90_chunks_make_5_batches_and_a_fresh_ledger_adopts_them(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    """Each chunk's few requests are packed with other chunks' into batches of up to
    --batch-max-inputs (100 here: 5 batches; the default 50,000 would make one). The run
    stops with them running (the API gone), its ledger is lost, and the rerun adopts all
    five from the provider's list, each chunk its own lines: nothing created or paid twice."""
    texts = [f"night text {i} of many small chunks" for i in range(450)]
    rows = write_csv(tmp_path / "in.csv", texts)
    packed = {"chunk_size": 5, "batch_max_inputs": 100}
    server.hold, server.poll_status = True, 503  # submitted, then the API goes away
    first = run_flow(tmp_path, server, prefect_api_url, max_attempts=1, **packed)
    assert first["exit_code"] == 1, first["message"]
    assert "5 batches keep running at the provider" in first["message"], first["message"]
    batches = list(server.batches.values())
    assert len(batches) == server.batch_counters()["creates"] == 5  # not 90
    # 3 requests per chunk (--batch-size 2), 20 chunks (100 inputs) per batch
    assert sorted(b["request_counts"]["total"] for b in batches) == [30, 60, 60, 60, 60]
    (tmp_path / "ledger.sqlite3").unlink()  # a fresh ledger: the provider is the truth
    server.hold, server.poll_status = False, None
    summary = run_flow(tmp_path, server, prefect_api_url, **packed)
    assert summary["exit_code"] == 0, summary["message"]
    assert summary["chunks_total"] == 90
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == counters["batches"] == 5  # adopted, not created again
    assert counters["batch_inputs"] == len(texts) == summary["inputs"]  # each billed once
    assert counters["requests"] == 0
    assert summary["batches"] == 5


def test_a_packed_batch_over_the_enqueued_token_limit_is_packed_again_within_it(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    """The three chunks packed in one batch exceed the account's enqueued-token limit
    (failed: token_limit_exceeded); the limit its message states caps the batches packed
    after it, so each chunk's requests go in a batch that fits, one after the other."""
    rows = write_csv(tmp_path / "in.csv", TEXTS)
    server.enqueued_token_limit = 25  # about one chunk's requests at a time
    summary = run_flow(tmp_path, server, prefect_api_url, batch_max_inputs=PACKED)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    first = min(server.batches.values(), key=lambda b: b["id"])
    assert first["status"] == "failed" and first["request_counts"]["total"] == 5
    assert server.batch_counters()["batch_inputs"] == distinct(rows)
    assert server.batch_counters()["requests"] == 0
