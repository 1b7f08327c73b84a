"""Endpoints as users really have them (issue 8, items 1 and 3-8): a real ``embedline run``
process against the loopback fake server switched into the misbehaviour public bug reports
describe for vLLM, TEI, infinity, Gemini's compatibility layer and Azure-style gateways.
Every published vector is checked against the server's deterministic vector for its text."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.output import read_local_output

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

TEXTS = {f"{i:03d}": f"package {i} does useful thing number {i * 7}" for i in range(20)}


def _input(tmp_path: Path, texts: dict[str, str] = TEXTS) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(("id", "text"))
    writer.writerows(texts.items())
    path = tmp_path / "in.csv"
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _run(
    tmp_path: Path, server: FakeEmbeddingServer, *extra: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    args = [
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-retries",
        "0",
        *extra,
    ]
    result = run_cli(*args, cwd=tmp_path, env=env)
    return result.returncode, result.stdout, result.stderr


def _summary_requests(out: str) -> int:
    line = next(x for x in out.splitlines() if x.startswith("api"))
    return int(line.split()[1].replace(",", ""))


def _summary_inputs(out: str) -> int:
    """The texts the summary says were sent: charged, plus those of retried or failed
    requests (not charged)."""
    line = next(x for x in out.splitlines() if x.startswith("api"))
    charged = re.search(r"([\d,]+) inputs? charged", line)
    retried = re.search(r"([\d,]+) texts? not charged", line)
    assert charged is not None, line
    return sum(int(m[1].replace(",", "")) for m in (charged, retried) if m is not None)


def _inputs_received(server: FakeEmbeddingServer) -> int:
    """Texts in every request the server received, answered or not."""
    with server.lock:
        return sum(entry["n_inputs"] for entry in server.log)


def _check_vectors(tmp_path: Path, dims: int = 384, texts: dict[str, str] = TEXTS) -> None:
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_published"] == len(texts) and manifest["rows_failed"] == 0
    assert set(vectors) == set(texts)
    for row_id, text in texts.items():
        np.testing.assert_allclose(vectors[row_id], expected_vector(text, dims), atol=1e-6)


def _chunk_objects(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out" / "chunks").glob("*.parquet"))


# -- item 1: a request-level 4xx is not 20 dead letters --------------------------------------


def test_a_rejected_parameter_stops_the_run_and_publishes_nothing(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path)
    fake_openai.reject_params = {"dimensions": "dimensions is currently not supported"}
    code, out, err = _run(tmp_path, fake_openai, "--dimensions", "64", "--chunk-size", "20")
    assert code == 3, out + err
    assert "dimensions is currently not supported" in out + err
    assert fake_openai.requests <= 3  # the batch and two rows alone, not 36
    assert _summary_requests(out) == fake_openai.requests
    assert _chunk_objects(tmp_path) == []  # nothing made final
    dead = run_cli(
        "dead-letters", out.split()[1], "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path
    )
    assert dead.stdout.strip() == ""
    # the server is fixed: a rerun embeds every row
    fake_openai.reject_params = {}
    code, out, err = _run(tmp_path, fake_openai, "--dimensions", "64", "--chunk-size", "20")
    assert code == 0, out + err
    _check_vectors(tmp_path, dims=64)


def test_a_request_level_rejection_with_concurrent_chunks_stops_within_a_few_requests(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = {f"{i:04d}": f"text number {i}" for i in range(400)}
    _input(tmp_path, texts)
    fake_openai.reject_params = {"dimensions": "Unrecognized request argument: dimensions"}
    code, out, err = _run(
        tmp_path, fake_openai, "--dimensions", "64", "--chunk-size", "50", "--concurrency", "4"
    )
    assert code == 3, out + err
    assert "Unrecognized request argument: dimensions" in out + err
    assert fake_openai.requests <= 3 * 5  # at most 3 per chunk in flight (window 5)
    assert _chunk_objects(tmp_path) == []


def test_one_rejected_row_is_still_a_dead_letter(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = dict(TEXTS, **{"007": "this row is POISON for the server"})
    _input(tmp_path, texts)
    fake_openai.reject_texts_containing = "POISON"
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "20")
    assert code == 1, out + err
    dead = run_cli(
        "dead-letters", out.split()[1], "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path
    )
    assert dead.stdout.split() == ["007", "rejected", "400"]


# -- item 3: servers that refuse base64 -------------------------------------------------------


@pytest.mark.parametrize("status", [400, 422, 500])
def test_a_server_refusing_base64_gets_float_for_the_whole_run(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, status: int
) -> None:
    _input(tmp_path)
    fake_openai.base64_refusal = status
    code, out, err = _run(
        tmp_path, fake_openai, "--chunk-size", "5", "--batch-size", "5", "--concurrency", "1"
    )
    assert code == 0, out + err
    formats = [e["encoding_format"] for e in fake_openai.log]
    assert formats[0] == "base64"
    assert formats.count("base64") <= 2  # two chunk tasks start at once; then float for good
    assert formats.count("float") == 4  # one accepted request per chunk
    assert _summary_requests(out) == fake_openai.requests
    assert (out + err).count("using float for the rest of the run") == 1
    _check_vectors(tmp_path)


def test_encoding_format_float_never_sends_base64(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path)
    fake_openai.base64_refusal = 500
    code, out, err = _run(tmp_path, fake_openai, "--encoding-format", "float")
    assert code == 0, out + err
    assert {e["encoding_format"] for e in fake_openai.log} == {"float"}
    _check_vectors(tmp_path)


# -- item 4: Gemini-style missing index, and bad 200s retried once ----------------------------


def test_a_missing_first_index_is_accepted(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path)
    fake_openai.omit_first_index = True
    fake_openai.shuffle_index = False
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "10")
    assert code == 0, out + err
    assert fake_openai.requests == 2
    _check_vectors(tmp_path)


def test_a_deterministic_bad_200_is_sent_at_most_twice(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path)
    wrong_count = {"status": 200, "body": json.dumps({"object": "list", "data": []})}
    fake_openai.fail_when(lambda payload: wrong_count)
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "20", "--max-attempts", "6")
    assert code == 1, out + err
    assert fake_openai.requests == 2  # not 6, every one billed
    assert _summary_requests(out) == 2
    assert _chunk_objects(tmp_path) == []


# -- item 5: Azure-style api-key header -------------------------------------------------------


def test_auth_header_api_key_from_flag_and_from_env(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path)
    fake_openai.require_key, fake_openai.key_header = "azure-secret-1", "api-key"
    env = {"EMBEDLINE_API_KEY": "azure-secret-1"}
    code, out, err = _run(tmp_path, fake_openai, env=env)
    assert code == 3, out + err
    assert "'Authorization: Bearer" in out + err and "--auth-header api-key" in out + err
    assert "azure-secret-1" not in out + err
    code, out, err = _run(tmp_path, fake_openai, "--auth-header", "api-key", env=env)
    assert code == 0, out + err
    _check_vectors(tmp_path)
    again = tmp_path / "env"
    again.mkdir()
    _input(again)
    code, out, err = _run(again, fake_openai, env={**env, "EMBEDLINE_AUTH_HEADER": "api-key"})
    assert code == 0, out + err
    _check_vectors(again)


# -- item 6: a per-request input cap is learned once -----------------------------------------


def test_a_per_request_input_cap_is_remembered_for_the_rest_of_the_run(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = {f"{i:04d}": f"row {i} of a capped server" for i in range(256)}
    _input(tmp_path, texts)
    fake_openai.max_inputs = 16
    code, out, err = _run(
        tmp_path, fake_openai, "--chunk-size", "64", "--batch-size", "64", "--concurrency", "1"
    )
    assert code == 0, out + err
    rejected = [e for e in fake_openai.log if e["status"] == 400]
    assert len(rejected) <= 8  # paid by the two chunks that run first (64, 63, 32, 31 each)
    later = fake_openai.log[-8:]  # the last two chunks: 128 rows in requests of 16, no 400
    assert [(e["n_inputs"], e["status"]) for e in later] == [(16, 200)] * 8
    assert "at most 16 inputs per request" in out + err
    _check_vectors(tmp_path, texts=texts)


# -- item 7: a 200 whose body is an error object ----------------------------------------------


def test_a_200_error_body_is_shown_redacted(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path)
    body = json.dumps({"error": {"message": "upstream model crashed (code 7)", "code": "x"}})
    fake_openai.fail_when(lambda payload: {"status": 200, "body": body})
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "20")
    assert code == 1, out + err
    assert "upstream model crashed (code 7)" in out + err
    assert TEXTS["003"] not in out + err


# -- item 8: the summary counts every request sent --------------------------------------------


def test_requests_of_failed_chunks_and_dead_letters_are_counted(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = dict(TEXTS, **{"002": "BROKEN row", "012": "REJECT me"})
    _input(tmp_path, texts)
    fake_openai.reject_texts_containing = "REJECT"
    fake_openai.fail_when(
        lambda p: {"status": 503} if any("BROKEN" in t for t in p["input"]) else None
    )
    code, out, err = _run(
        tmp_path, fake_openai, "--chunk-size", "10", "--max-attempts", "2", "--concurrency", "1"
    )
    assert code == 1, out + err
    assert fake_openai.requests > 2
    assert _summary_requests(out) == fake_openai.requests
    assert _summary_inputs(out) == _inputs_received(fake_openai)  # failed chunks' texts too


def test_requests_of_chunk_attempts_prefect_retried_are_counted(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """A chunk whose first task attempt failed and whose Prefect retry published it: the
    summary counts both attempts' requests (it counted only the last attempt's)."""
    _input(tmp_path)
    failures = iter([True, True, True])
    fake_openai.fail_when(
        lambda p: (
            {"status": 503}
            if "package 3 " in " ".join(p["input"]) and next(failures, False)
            else None
        )
    )
    code, out, err = _run(
        tmp_path,
        fake_openai,
        "--chunk-size",
        "10",
        "--max-attempts",
        "2",
        "--concurrency",
        "1",
        "--chunk-retries",
        "1",
        "--chunk-retry-delay",
        "0",
    )
    assert code == 0, out + err
    assert fake_openai.requests == 2 + 2 + 1  # attempt 1: 2 x 503; retry: 503, then 200; chunk 2
    assert _summary_requests(out) == fake_openai.requests
    assert _summary_inputs(out) == _inputs_received(fake_openai) == 5 * 10


def test_a_chunk_failing_after_prefects_retry_logs_one_error_line(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """Prefect's "Task run failed with exception: … - Retries are exhausted" repeated the
    dispatcher's "chunk 0 failed: …" (two ERROR lines per chunk with --chunk-retries 1)."""
    _input(tmp_path)
    fake_openai.fail_when(
        lambda p: {"status": 503} if "package 3 " in " ".join(p["input"]) else None
    )
    code, out, err = _run(
        tmp_path,
        fake_openai,
        "--chunk-size",
        "10",
        "--max-attempts",
        "1",
        "--chunk-retries",
        "1",
        "--chunk-retry-delay",
        "0",
    )
    assert code == 1, out + err
    errors = [line for line in err.splitlines() if "| ERROR" in line]
    assert len(errors) == 1 and "chunk 0 failed: RetryableError: HTTP 503" in errors[0], errors
    assert "Retry 1/1 will start" in err  # Prefect's retry itself is still one INFO line
    assert fake_openai.requests == 3  # chunk 0 twice, chunk 1 once


def _sigint_during_dispatch(
    tmp_path: Path,
    fake: FakeEmbeddingServer,
    *,
    rows: int,
    delay_s: float,
    batch_size: int,
    grace_s: float,
    after_requests: int,
) -> tuple[int, str, str]:
    """Run ``rows`` rows in chunks of 40 (3 in flight) against a server that answers after
    ``delay_s``; SIGINT once it received ``after_requests`` requests; return (code, out, err)."""
    texts = {f"{i:03d}": f"package {i} does useful thing number {i * 7}" for i in range(rows)}
    _input(tmp_path, texts)
    fake.fail_when(lambda p: {"delay_s": delay_s})
    args = [
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        fake.base_url,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "40",
        "--batch-size",
        str(batch_size),
        "--concurrency",
        "3",
        "--grace",
        str(grace_s),
    ]
    proc = popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while fake.requests < after_requests:
            assert time.monotonic() < deadline and proc.poll() is None, "no requests"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, out, err


def test_requests_of_chunks_released_at_the_end_of_the_grace_period_are_counted(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """SIGINT with a short --grace: chunks still running when it ends are released, and the
    batches they had sent are in the summary (they were not: 105 counted, 122 sent). Only a
    request still on the wire at that moment can be missing: at most --concurrency."""
    code, out, err = _sigint_during_dispatch(
        tmp_path, fake_openai, rows=400, delay_s=0.15, batch_size=4, grace_s=0.5, after_requests=12
    )
    assert code == 130, err[-3000:]
    assert "released" in out, out
    time.sleep(0.5)  # a request on the wire at the release still reaches the server
    assert fake_openai.requests - 3 <= _summary_requests(out) <= fake_openai.requests, out
    received = _inputs_received(fake_openai)
    assert received - 3 * 4 <= _summary_inputs(out) <= received, out  # released batches too


# -- item 10: a chunk whose texts are all empty, --dimensions unset ---------------------------


def test_a_chunk_of_only_empty_texts_is_a_0_row_chunk_with_its_dead_letters(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = {"a": "first text", "b": "second text", "c": "", "d": "  ", "e": "\t"}
    _input(tmp_path, texts)
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "2", "--allow-failed-rows")
    assert code == 0, out + err
    manifest, vectors = read_local_output(tmp_path / "out")
    assert set(vectors) == {"a", "b"} and manifest["dimensions"] == 384
    assert [c["rows"] for c in manifest["chunks"]] == [2, 0, 0]
    dead = run_cli(
        "dead-letters", out.split()[1], "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path
    )
    assert [line.split("\t")[:2] for line in dead.stdout.splitlines()] == [
        ["c", "empty_text"],
        ["d", "empty_text"],
        ["e", "empty_text"],
    ]
    from embedline import read_embeddings

    frame = read_embeddings(str(tmp_path / "out"))
    assert sorted(frame["id"]) == ["a", "b"]
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "2", "--allow-failed-rows")
    assert code == 0, out + err  # the rerun finds the committed run


# -- item 2: rejected dead letters are not final forever --------------------------------------


def test_retry_failed_dead_letters_resends_only_them_and_supersedes_the_chunk(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = dict(TEXTS, **{"004": "a FLAKY row", "015": "another FLAKY row", "009": " "})
    _input(tmp_path, texts)
    fake_openai.reject_texts_containing = "FLAKY"
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "10")
    assert code == 1, out + err
    run_key = out.split()[1]
    first = {p.name: p.read_bytes() for p in _chunk_objects(tmp_path)}
    assert len(first) == 2
    # the same command again: dead letters are final without asking
    before = fake_openai.requests
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "10")
    assert code == 1 and fake_openai.requests == before
    # the server accepts them now: retry-failed --dead-letters sends those two rows only
    fake_openai.reject_texts_containing = None
    fake_openai.reset()
    ledger = str(tmp_path / "ledger.sqlite3")
    retry = run_cli(
        "retry-failed", run_key[:12], "--dead-letters", "--ledger", ledger, cwd=tmp_path
    )
    assert retry.returncode == 0, retry.stdout + retry.stderr  # " " is skipped, commits
    assert sum(e["n_inputs"] for e in fake_openai.log) == 2
    dead = run_cli("dead-letters", run_key[:12], "--ledger", ledger, cwd=tmp_path)
    assert [line.split("\t")[:2] for line in dead.stdout.splitlines()] == [["009", "empty_text"]]
    for name, body in first.items():  # nothing overwritten: generation 0 is as it was
        assert (tmp_path / "out" / "chunks" / name).read_bytes() == body
    assert sorted(p.name.split(".", 1)[1] for p in _chunk_objects(tmp_path)) == [
        "g1.parquet",
        "g1.parquet",
        "parquet",
        "parquet",
    ]
    # a fresh ledger finds the newest generation in the store and commits it, sending nothing
    fake_openai.reset()
    (tmp_path / "ledger.sqlite3").unlink()
    code, out, err = _run(
        tmp_path, fake_openai, "--chunk-size", "10", "--allow-failed-rows", "--retry-dead-letters"
    )
    assert code == 0, out + err
    assert fake_openai.requests == 0
    manifest, vectors = read_local_output(tmp_path / "out")
    assert all(".g1." in c["object"] for c in manifest["chunks"])
    assert manifest["rows_failed"] == 1 and set(vectors) == set(texts) - {"009"}
    for row_id, vector in vectors.items():
        np.testing.assert_allclose(vector, expected_vector(texts[row_id]), atol=1e-6)


def test_a_rerun_with_another_setting_retries_the_dead_letters_it_may_fix(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    long_text = "word " * 40  # 200 characters: over --max-input-tokens 20
    texts = dict(TEXTS, **{"003": long_text})
    _input(tmp_path, texts)
    args = ("--chunk-size", "10", "--max-input-tokens", "20")
    code, out, err = _run(tmp_path, fake_openai, *args)
    assert code == 1, out + err  # 003 is a too_long dead letter, never sent
    fake_openai.reset()
    code, out, err = _run(tmp_path, fake_openai, *args)
    assert code == 1 and fake_openai.requests == 0  # same settings: final
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "10", "--max-input-tokens", "60")
    assert code == 0, out + err
    assert [e["n_inputs"] for e in fake_openai.log] == [1]  # only the dead letter is sent
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_failed"] == 0 and set(vectors) == set(texts)
    np.testing.assert_allclose(vectors["003"], expected_vector(long_text), atol=1e-6)


def _run_key(tmp_path: Path, generation: int = 0) -> str:
    """The run key of ``in.csv`` (docs/reference/keys.md, computed here from the recipe)."""
    digest = hashlib.sha256((tmp_path / "in.csv").read_bytes()).hexdigest()
    parts = ["run.v1", digest, "id", "text", "text-embedding-3-small", "", "10"]
    parts += [f"g{generation}"] if generation else []
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _manifest(tmp_path: Path, run_key: str) -> dict[str, object]:
    return json.loads((tmp_path / "out" / "manifests" / f"{run_key}.json").read_text())


def test_a_committed_run_is_superseded_by_a_generation_that_sends_only_its_dead_letters(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = dict(TEXTS, **{"004": "a FLAKY row", "015": "another FLAKY row", "009": " "})
    _input(tmp_path, texts)
    fake_openai.reject_texts_containing = "FLAKY"
    sink = f"lancedb://{tmp_path}/lance?table=docs"
    args = ("--chunk-size", "10", "--allow-failed-rows", "--sink", sink)
    code, out, err = _run(tmp_path, fake_openai, *args)
    assert code == 0, out + err  # committed with 3 dead letters, 17 rows loaded
    first, second = _run_key(tmp_path), _run_key(tmp_path, generation=1)
    committed = (tmp_path / "out" / "manifests" / f"{first}.json").read_bytes()
    assert _manifest(tmp_path, first)["dead_letters"] == {"empty_text": 1, "rejected": 2}
    # the server accepts them now; retry-failed --dead-letters sends those two rows only
    fake_openai.reject_texts_containing = None
    fake_openai.reset()
    retry = run_cli(
        "retry-failed",
        first[:12],
        "--dead-letters",
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        cwd=tmp_path,
    )
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert sum(e["n_inputs"] for e in fake_openai.log) == 2
    assert f"run        {second} (generation 1" in retry.stdout
    manifest = _manifest(tmp_path, second)
    assert manifest["generation"] == 1 and manifest["supersedes"] == first
    assert manifest["rows_failed"] == 1 and manifest["dead_letters"] == {"empty_text": 1}
    assert manifest["changes"]["base_run_key"] == first and manifest["changes"]["added"] == 2
    assert (tmp_path / "out" / "manifests" / f"{first}.json").read_bytes() == committed
    # readers see the newest generation; every vector against the server's own
    from embedline import read_embeddings

    frame = read_embeddings(str(tmp_path / "out"))
    assert frame.attrs["run_key"] == second and set(frame["id"]) == set(texts) - {"009"}
    for row_id, vector in zip(frame["id"], frame["embedding"], strict=True):
        np.testing.assert_allclose(vector, expected_vector(texts[row_id]), atol=1e-6)
    import lancedb  # the sink got the generation's change set: the two rows are added

    rows = lancedb.connect(str(tmp_path / "lance")).open_table("docs").to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(set(texts) - {"009"})
    for row in rows:
        np.testing.assert_allclose(row["embedding"], expected_vector(texts[row["id"]]), atol=1e-6)
    # the original command, and a retry with nothing retryable left: complete, nothing sent
    fake_openai.reset()
    for extra in ((), ("--retry-dead-letters",)):
        code, out, err = _run(tmp_path, fake_openai, *args, *extra)
        assert code == 0 and out.split()[1] == second, out + err
    assert fake_openai.requests == 0
    assert len(list((tmp_path / "out" / "manifests").glob("*.json"))) == 2


def test_a_committed_run_is_retried_when_the_request_settings_change(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path, dict(TEXTS, **{"003": "word " * 40}))  # over --max-input-tokens 20
    args = ("--chunk-size", "10", "--allow-failed-rows", "--max-input-tokens")
    assert _run(tmp_path, fake_openai, *args, "20")[0] == 0
    fake_openai.reset()
    code, out, err = _run(tmp_path, fake_openai, *args, "60")  # now within the limit
    assert code == 0, out + err
    assert [e["n_inputs"] for e in fake_openai.log] == [1]
    manifest = _manifest(tmp_path, _run_key(tmp_path, generation=1))
    assert manifest["rows_failed"] == 0 and manifest["supersedes"] == _run_key(tmp_path)


def test_a_chunk_released_at_the_end_of_the_grace_period_is_cancelled_in_prefect(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    """A chunk task that stops because the run released its chunk ends Cancelled (work
    stopped on request), not Failed with a StopRequestedError (before: Failed, so the UI
    showed a Ctrl-C as failed chunks)."""
    import httpx

    code, _out, err = _sigint_during_dispatch(
        tmp_path, fake_openai, rows=200, delay_s=0.5, batch_size=2, grace_s=0.2, after_requests=6
    )
    assert code == 130, err[-3000:]
    flow_run_id = re.search(r"flow-run/([0-9a-f-]{36})", err)
    assert flow_run_id, err[-3000:]
    task_runs = httpx.post(
        f"{prefect_api_url}/task_runs/filter",
        json={"flow_runs": {"id": {"any_": [flow_run_id.group(1)]}}},
    ).json()
    states = {t["name"]: t["state"]["type"] for t in task_runs if t["name"].startswith("embed-")}
    assert "CANCELLED" in states.values() and "FAILED" not in states.values(), states
