"""Crashes and stops, injected for real: SIGKILL at random moments, SIGTERM/SIGINT, fatal
API answers. After the final rerun the output is complete and correct, no row appears twice,
no object was overwritten, no temp file is left and the ledger passes integrity_check."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.output import read_local_output, vectors_by_id
from tests.support.s3_servers import make_bucket, shared_client

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]


class TextRecorder:
    """A fail_when hook: records the texts of every request, delays those with a marker."""

    def __init__(self, delays: dict[str, float] | None = None, default_delay_s: float = 0.0):
        self.delays = delays or {}
        self.default_delay_s = default_delay_s
        self.texts: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, payload: Any) -> dict[str, Any] | None:
        texts = payload.get("input", []) if isinstance(payload, dict) else []
        with self.lock:
            self.texts.extend(texts)
        delay = max(
            [self.delays[m] for m in self.delays if any(m in t for t in texts)],
            default=self.default_delay_s,
        )
        return {"delay_s": delay} if delay else None

    def take(self) -> list[str]:
        with self.lock:
            texts, self.texts = self.texts, []
            return texts


def _write_csv(
    path: Path, n: int, marker_rows: dict[int, str] | None = None
) -> list[tuple[str, str]]:
    rows = []
    for i in range(n):
        text = f"row {i} {(marker_rows or {}).get(i, '')}\nsecond line {i}"
        rows.append((f"r{i:04d}", text))
    body = "id,text\n" + "".join(f'{rid},"{text}"\n' for rid, text in rows)
    path.write_text(body, encoding="utf-8")
    return rows


def _args(
    tmp_path: Path, server: FakeEmbeddingServer, *extra: str, output: str | None = None
) -> list[str]:
    return [
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        output or str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-retries",
        "0",
        *extra,
    ]


def _popen(
    tmp_path: Path, args: list[str], extra_env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(extra_env or {})}
    return popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _chunk_files(out: Path) -> dict[str, str]:
    chunks = out / "chunks"
    if not chunks.exists():
        return {}
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in chunks.iterdir()
        if p.name.endswith(".parquet") and not p.name.startswith(".")
    }


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _assert_complete(tmp_path: Path, rows: list[tuple[str, str]]) -> None:
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_published"] == len(rows) and manifest["rows_failed"] == 0
    assert set(vectors) == {rid for rid, _ in rows}
    for rid, text in rows:
        np.testing.assert_allclose(vectors[rid], expected_vector(text), rtol=1e-6)
    leftovers = [p.name for p in (tmp_path / "out").rglob(".*.tmp-*")]
    assert leftovers == []
    db = sqlite3.connect(tmp_path / "ledger.sqlite3")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE state = 'running'").fetchone()[0] == 0


class _S3Output:
    """The run's output as a fresh bucket on an S3 server: chunk digests, then manifest."""

    def __init__(self, endpoint: str) -> None:
        self.bucket = make_bucket(endpoint)
        self.uri, self.client = f"s3://{self.bucket}/out", shared_client(endpoint)
        self.env = {"AWS_ENDPOINT_URL": endpoint}

    def chunk_files(self) -> dict[str, str]:
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix="out/chunks/")
        return {
            o["Key"].rsplit("/", 1)[1]: self._sha(o["Key"])
            for o in listed.get("Contents", [])
            if o["Key"].endswith(".parquet")
        }

    def _sha(self, key: str) -> str:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return hashlib.sha256(body).hexdigest()

    def assert_complete(self, rows: list[tuple[str, str]]) -> None:
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix="out/manifests/")
        [key] = [o["Key"] for o in listed.get("Contents", [])]
        get = self.client.get_object
        manifest = json.loads(get(Bucket=self.bucket, Key=key)["Body"].read())
        bodies = {
            e["object"]: get(Bucket=self.bucket, Key=f"out/{e['object']}")["Body"].read()
            for e in manifest["chunks"]
        }
        vectors = vectors_by_id(bodies, manifest)
        assert manifest["rows_published"] == len(rows) and manifest["rows_failed"] == 0
        assert set(vectors) == {rid for rid, _ in rows}
        for rid, text in rows:
            np.testing.assert_allclose(vectors[rid], expected_vector(text), rtol=1e-6)


# on ministack: slow (about 10 s, 45 s on a loaded machine), out of make test's budget; the
# fresh-ledger rerun on ministack (test_cli_run.py) is CI's resume check on a second S3 server
@pytest.mark.parametrize("output", ["local", pytest.param("ministack", marks=pytest.mark.slow)])
def test_kill_while_slow_chunk_in_flight_rerun_embeds_only_unfinished_chunks(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    output: str,
    request: pytest.FixtureRequest,
) -> None:
    """kill -9 with chunks in flight, then a rerun: only the unfinished chunks are embedded,
    none published before is rewritten; on a local directory and on ministack (S3)."""
    s3 = _S3Output(request.getfixturevalue("ministack_endpoint")) if output != "local" else None
    out = s3.uri if s3 else str(tmp_path / "out")
    env = s3.env if s3 else {}

    def chunk_files() -> dict[str, str]:
        return s3.chunk_files() if s3 else _chunk_files(tmp_path / "out")

    # 5 chunks of 4 rows; chunk 0 and chunk 4 are slow, 1-3 fast; 4 in flight at once
    rows = _write_csv(tmp_path / "in.csv", 20, {0: "SLOW", 16: "SLOW"})
    recorder = TextRecorder({"SLOW": 60.0})
    fake_openai.fail_when(recorder)
    args = _args(tmp_path, fake_openai, "--chunk-size", "4", "--concurrency", "3", output=out)
    proc = _popen(tmp_path, args, env)
    try:
        _wait_for(lambda: len(chunk_files()) == 3, 120, "chunks 1-3")
        time.sleep(0.3)  # let the flow record them
    finally:
        proc.kill()
        proc.wait()
    published = chunk_files()
    recorder.take()
    recorder.delays = {}
    result = run_cli(*args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    sent = recorder.take()
    sent_rows = sorted({int(t.split()[1]) for t in sent})
    assert sent_rows == [0, 1, 2, 3, 16, 17, 18, 19]  # exactly chunks 0 and 4
    assert {k: v for k, v in chunk_files().items() if k in published} == published
    if s3:
        s3.assert_complete(rows)
    else:
        _assert_complete(tmp_path, rows)


def _kill_loop(tmp_path: Path, server: FakeEmbeddingServer, kills: int, seed: int) -> None:
    # enough work that every kill lands: start-up is now ~1.5 s, so a run does real work
    # in most of the 1-5 s before its kill (24 rows a kill at 0.1 s finished after 6 kills)
    rows = _write_csv(tmp_path / "in.csv", 48 * kills)
    server.fail_when(TextRecorder(default_delay_s=0.2))
    rng = random.Random(seed)
    args = _args(tmp_path, server, "--chunk-size", "3", "--batch-size", "2", "--concurrency", "2")
    seen: dict[str, str] = {}
    finished_early = killed = 0
    for _ in range(kills):
        proc = _popen(tmp_path, args)
        time.sleep(rng.uniform(1.0, 5.0))  # start-up, planning, dispatch, manifest
        if proc.poll() is not None:
            finished_early += 1
            break
        proc.kill()
        proc.wait()
        killed += 1
        files = _chunk_files(tmp_path / "out")
        for name, digest in seen.items():
            assert files[name] == digest, f"{name} was overwritten"  # never rewritten
        seen.update(files)
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _assert_complete(tmp_path, rows)
    counters = server.counters()
    assert counters["inputs"] >= len(rows)
    answered = [e["idempotency_key"] for e in server.log if e["status"] == 200]
    # a re-sent batch (its chunk was in flight at a kill) carries the same Idempotency-Key,
    # so a server that honours keys charges it once
    charged_once = len(set(answered))
    assert killed >= min(kills, 8)
    print(
        f"\nkill loop: {killed} SIGKILLs of {kills} planned, {len(seen)} chunk objects seen "
        "and never rewritten, "
        f"finished before a kill: {finished_early}, requests {counters['requests']}, "
        f"inputs embedded {counters['inputs']} for {len(rows)} rows, answered requests "
        f"{len(answered)} with {charged_once} distinct idempotency keys"
    )


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_random_sigkills_then_rerun_give_complete_output(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _kill_loop(tmp_path, fake_openai, kills=10, seed=20261129)


@pytest.mark.slow
def test_many_random_sigkills_soak(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> None:
    _kill_loop(
        tmp_path,
        fake_openai,
        kills=int(os.environ.get("EMBEDLINE_SOAK_KILLS", "60")),
        seed=int(os.environ.get("EMBEDLINE_SOAK_SEED", "7")),
    )


def _write_rows(path: Path, rows: list[tuple[str, str]]) -> None:
    path.write_text(
        "id,text\n" + "".join(f'{rid},"{text}"\n' for rid, text in rows), encoding="utf-8"
    )


def _newest_output(out: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    manifests = [json.loads(p.read_text()) for p in (out / "manifests").glob("*.json")]
    manifest = max(manifests, key=lambda m: m["created_at"])
    bodies = {e["object"]: (out / e["object"]).read_bytes() for e in manifest["chunks"]}
    return manifest, vectors_by_id(bodies, manifest)


def _reuse_kill_loop(tmp_path: Path, server: FakeEmbeddingServer, kills: int, seed: int) -> None:
    """Yesterday's run completes; today's input reorders yesterday's rows (every chunk key
    changes: all of them are reuse hits) and adds new texts, each at two ids in different
    chunks (in-run deduplication); today's run is SIGKILLed at random moments, then rerun."""
    yesterday = _write_csv(tmp_path / "in.csv", 12 * kills)
    args = _args(tmp_path, server, "--chunk-size", "3", "--batch-size", "2", "--concurrency", "2")
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    known = {text for _, text in yesterday}
    new_texts = [f"new text {k}\nsecond line" for k in range(6 * kills)]
    today = list(reversed(yesterday))
    for k, text in enumerate(new_texts):
        today.insert((7 * k) % len(today), (f"n{k:04d}a", text))
        today.append((f"n{k:04d}b", text))
    _write_rows(tmp_path / "in.csv", today)
    recorder = TextRecorder(default_delay_s=0.1)
    server.fail_when(recorder)
    rng = random.Random(seed)
    killed = 0
    for _ in range(kills):
        proc = _popen(tmp_path, args)
        time.sleep(rng.uniform(1.0, 5.0))
        if proc.poll() is not None:
            break
        proc.kill()
        proc.wait()
        killed += 1
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest, vectors = _newest_output(tmp_path / "out")
    assert sorted(vectors) == sorted(rid for rid, _ in today)
    for rid, text in today:
        np.testing.assert_allclose(vectors[rid], expected_vector(text), rtol=1e-6)
    assert manifest["changes"]["added"] == 2 * len(new_texts)
    assert manifest["changes"]["removed"] == manifest["changes"]["changed"] == 0
    sent = recorder.take()
    assert not known & set(sent), "a text the output already held was sent again"
    assert set(sent) == set(new_texts)
    # each new text is charged once, but for requests in flight at a kill (2 requests of at
    # most 2 inputs each) or of a chunk that was waiting for another chunk's text
    extra = len(sent) - len(new_texts)
    assert extra <= 4 * killed, (extra, killed)
    print(
        f"\nreuse kill loop: {killed} SIGKILLs, {len(known)} known texts sent 0 times, "
        f"{len(new_texts)} new texts sent {len(sent)} times"
    )


def test_random_sigkills_during_a_reusing_run_then_rerun(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _reuse_kill_loop(tmp_path, fake_openai, kills=4, seed=20261201)


@pytest.mark.slow
def test_many_random_sigkills_during_reusing_runs_soak(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _reuse_kill_loop(
        tmp_path,
        fake_openai,
        kills=int(os.environ.get("EMBEDLINE_SOAK_KILLS", "60")),
        seed=int(os.environ.get("EMBEDLINE_SOAK_SEED", "7")),
    )


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_gracefully_and_rerun_resumes(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, signum: int, code: int
) -> None:
    rows = _write_csv(tmp_path / "in.csv", 40)
    fake_openai.fail_when(TextRecorder(default_delay_s=0.3))
    args = _args(tmp_path, fake_openai, "--chunk-size", "4", "--concurrency", "2", "--grace", "20")
    proc = _popen(tmp_path, args)
    _wait_for(lambda: len(_chunk_files(tmp_path / "out")) >= 1, 120, "a published chunk")
    proc.send_signal(signum)
    started = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert time.monotonic() - started < 20
    assert "interrupted" in out and "rerun the same command" in out
    published = len(_chunk_files(tmp_path / "out"))
    name = signal.Signals(signum).name  # stderr ends with what happened and what to do
    assert err.strip().splitlines()[-1] == (
        f"embedline: interrupted by {name}: {published} of "
        "10 chunks published; rerun the same command to "
        "resume"
    ), err[-2000:]
    db = sqlite3.connect(tmp_path / "ledger.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE state = 'running'").fetchone()[0] == 0
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert 1 <= published < 10
    fake_openai.fail_when(None)
    before = fake_openai.counters()["inputs"]
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert fake_openai.counters()["inputs"] - before <= (10 - published) * 4
    _assert_complete(tmp_path, rows)


def test_second_signal_exits_at_once(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> None:
    _write_csv(tmp_path / "in.csv", 20)
    fake_openai.fail_when(TextRecorder(default_delay_s=5.0))
    proc = _popen(tmp_path, _args(tmp_path, fake_openai, "--chunk-size", "4", "--grace", "60"))
    _wait_for(lambda: fake_openai.counters()["requests"] >= 1, 120, "a request")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert time.monotonic() - started < 3
    db = sqlite3.connect(tmp_path / "ledger.sqlite3")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_wrong_api_key_exits_3_fast_without_leaking_the_key(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _write_csv(tmp_path / "in.csv", 40)
    fake_openai.require_key = "sk-right-key"
    started = time.monotonic()
    result = run_cli(
        *_args(tmp_path, fake_openai, "--chunk-size", "4", "--concurrency", "4"),
        cwd=tmp_path,
        env={"EMBEDLINE_API_KEY": "sk-wrong-secret"},
    )
    assert result.returncode == 3
    assert time.monotonic() - started < 60
    assert "EMBEDLINE_API_KEY" in result.stdout + result.stderr
    assert "sk-wrong-secret" not in result.stdout + result.stderr
    assert fake_openai.counters()["requests"] <= 5  # about one per in-flight chunk
    assert not (tmp_path / "out" / "manifests").exists()


def test_insufficient_quota_exits_3_without_retrying(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _write_csv(tmp_path / "in.csv", 8)
    quota = (
        '{"error": {"message": "You exceeded your current quota", '
        '"type": "insufficient_quota", "code": "insufficient_quota"}}'
    )
    fake_openai.fail_when(lambda payload: {"status": 429, "body": quota})
    result = run_cli(
        *_args(tmp_path, fake_openai, "--chunk-size", "4", "--concurrency", "1"), cwd=tmp_path
    )
    assert result.returncode == 3
    assert "quota" in (result.stdout + result.stderr).lower()
    assert fake_openai.counters()["requests"] <= 2
