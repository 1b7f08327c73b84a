"""Overlapping runs on one output never pay twice (tasks/lease/overlap.py): a run started
while an earlier one on the same output is still embedding waits for it, then copies what it
published; past ``--wait-for-live-run`` it steps aside (exit 75, nothing published); a lease
left by a killed run, or stale by the store's clock, holds no one up.

Real CLI processes against one fake server in this process; its charges per text
(``charged_texts``) are the judge, and every published vector is checked against the
server's vector for its text.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tasks.lease.held import LEASE_PREFIX, LEASE_SKEW_MARGIN_S, LEASE_TTL_S
from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.moto_server import make_s3_client
from tests.support.output import vectors_by_id

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

Rows = list[tuple[str, str]]
MODEL = "text-embedding-3-small"  # the openai embedder's default


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write(path: Path, rows: Rows) -> Path:
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows), encoding="utf-8")
    return path


def _args(
    tmp_path: Path,
    server: FakeEmbeddingServer,
    csv: Path,
    ledger: str,
    *extra: str,
    output: str | None = None,
) -> list[str]:
    return [
        "run",
        str(csv),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        output or str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / ledger),
        "--chunk-size",
        "6",
        "--batch-size",
        "2",
        "--concurrency",
        "1",
        *extra,
    ]


def _start(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_requests(server: FakeEmbeddingServer, n: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while server.counters()["requests"] < n:
        assert time.monotonic() < deadline, "the first run never started embedding"
        time.sleep(0.1)


def _run_key(stdout: str) -> str:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("run "))
    return line.split()[1]


class _Output:
    """The output root both runs share: a local directory, or a prefix on the moto server."""

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest, where: str) -> None:
        self.local, self.s3, self.env = tmp_path / "out", None, {}
        self.uri = str(self.local)
        if where == "s3":
            endpoint = request.getfixturevalue("moto_endpoint")
            self.bucket = request.getfixturevalue("s3_bucket")
            self.s3 = make_s3_client(endpoint)
            self.uri, self.env = f"s3://{self.bucket}/emb", {"AWS_ENDPOINT_URL": endpoint}

    def get(self, key: str) -> bytes:
        if self.s3 is None:
            return (self.local / key).read_bytes()
        return bytes(self.s3.get_object(Bucket=self.bucket, Key=f"emb/{key}")["Body"].read())

    def keys(self, prefix: str) -> list[str]:
        if self.s3 is None:
            return sorted(str(p.relative_to(self.local)) for p in self.local.glob(f"{prefix}*"))
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"emb/{prefix}")
        return sorted(o["Key"][len("emb/") :] for o in listed.get("Contents", []))


def _check_output(out: Path | _Output, run_key: str, rows: Rows) -> None:
    get = out.get if isinstance(out, _Output) else lambda key: (out / key).read_bytes()
    manifest = json.loads(get(f"manifests/{run_key}.json"))
    vectors = vectors_by_id({e["object"]: get(e["object"]) for e in manifest["chunks"]}, manifest)
    assert sorted(vectors) == sorted(i for i, _ in rows)
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6, atol=1e-7)


def _plant_lease(out: Path, run_key: str, *, age_s: float) -> Path:
    """A run lease of a run on another host, its last renewal ``age_s`` seconds ago."""
    path = out / f"{LEASE_PREFIX}{run_key}.{'f' * 16}.000000.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "run_key": run_key,
        "objects": [],
        "ttl_s": LEASE_TTL_S,
        "model": MODEL,
        "dimensions": None,
        "holder": {"host": "0" * 16, "pid": 1},
    }
    path.write_text(json.dumps(record))
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_run_started_while_another_embeds_waits_and_copies_instead_of_paying(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    nightly = [(f"n{i}", f"shared text {i}") for i in range(48)]
    manual = nightly[12:]  # the next export: 36 of the rows as they were, 6 new ones
    manual += [(f"new{i}", f"a new text {i}") for i in range(6)]
    first_csv = _write(tmp_path / "nightly.csv", nightly)
    second_csv = _write(tmp_path / "manual.csv", manual)
    out = _Output(tmp_path, request, where)
    with FakeEmbeddingServer(dims=384) as server:
        server.fail_when(lambda payload: {"delay_s": 0.6})  # 24 requests one at a time: ~15 s
        first = _start(
            _args(tmp_path, server, first_csv, "nightly.sqlite3", output=out.uri),
            tmp_path,
            out.env,
        )
        try:
            _wait_for_requests(server, 1)
            # another host's ledger: only the store tells the second run about the first
            second = run_cli(
                *_args(tmp_path, server, second_csv, "manual.sqlite3", output=out.uri),
                cwd=tmp_path,
                env=out.env,
            )
            first_out, first_err = first.communicate(timeout=300)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
        charged = server.charged_texts()
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"waiting for run {_run_key(first_out)[:12]}" in second.stderr
    assert "no earlier run on this output is running now" in second.stderr
    texts = {_sha(t) for _, t in nightly} | {_sha(t) for _, t in manual}
    assert set(charged) == texts and max(charged.values()) == 1, charged.most_common(3)
    _check_output(out, _run_key(first_out), nightly)
    _check_output(out, _run_key(second.stdout), manual)
    assert out.keys(LEASE_PREFIX) == []


def test_past_the_bound_a_run_steps_aside_with_exit_75_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    planted = _plant_lease(out, "a" * 64, age_s=5)  # live: renewed 5 s ago, on another host
    csv = _write(tmp_path / "in.csv", [(f"r{i}", f"text {i}") for i in range(12)])
    with FakeEmbeddingServer(dims=384) as server:
        started = time.monotonic()
        result = run_cli(
            *_args(tmp_path, server, csv, "ledger.sqlite3", "--wait-for-live-run", "3"),
            cwd=tmp_path,
        )
        took = time.monotonic() - started
        requests = server.counters()["requests"]
    assert result.returncode == 75, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"embedline: run {'a' * 12} on this output"), last
    assert "stepped aside, nothing published" in last and "error" not in last
    assert f"waiting for run {'a' * 12}, started " in result.stderr
    assert requests == 0
    assert not (out / "chunks").exists() or not list((out / "chunks").iterdir())
    assert not (out / "manifests").exists() or not list((out / "manifests").iterdir())
    assert sorted((out / LEASE_PREFIX).glob("*.json")) == [planted]  # ours is gone
    assert took < 60


def test_a_waiting_run_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "out"
    planted = _plant_lease(out, "a" * 64, age_s=5)
    csv = _write(tmp_path / "in.csv", [(f"r{i}", f"text {i}") for i in range(12)])
    with FakeEmbeddingServer(dims=384) as server:
        waiting = _start(
            _args(tmp_path, server, csv, "ledger.sqlite3", "--wait-for-live-run", "600"),
            tmp_path,
        )
        try:
            deadline = time.monotonic() + 120
            while len(list((out / LEASE_PREFIX).glob("*.json"))) < 2:  # its own lease
                assert waiting.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(1.0)  # into the wait
            os.kill(waiting.pid, signal.SIGTERM)
            _, err = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                os.killpg(waiting.pid, signal.SIGKILL)
    assert waiting.returncode == 143, err[-3000:]
    assert "waiting for run" in err
    assert sorted((out / LEASE_PREFIX).glob("*.json")) == [planted]


def test_a_killed_or_stale_run_holds_no_one_up(tmp_path: Path) -> None:
    rows = [(f"r{i}", f"text {i}") for i in range(36)]
    csv = _write(tmp_path / "in.csv", rows)
    out = tmp_path / "out"
    with FakeEmbeddingServer(dims=384) as server:
        server.fail_when(lambda payload: {"delay_s": 0.5})
        first = _start(_args(tmp_path, server, csv, "first.sqlite3"), tmp_path)
        try:
            _wait_for_requests(server, 4)
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # no finally: its lease stays behind
            first.wait(timeout=30)
        left = sorted((out / LEASE_PREFIX).glob("*.json"))
        assert left, "the killed run left no lease"
        # and a run on another host that stopped renewing over 16 min ago (store's clock)
        _plant_lease(out, "b" * 64, age_s=LEASE_TTL_S + LEASE_SKEW_MARGIN_S + 30)
        server.fail_when(None)
        started = time.monotonic()
        second = run_cli(
            *_args(tmp_path, server, csv, "second.sqlite3", "--wait-for-live-run", "600"),
            cwd=tmp_path,
        )
        took = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    assert "waiting for" not in second.stderr
    assert took < 120
    _check_output(out, _run_key(second.stdout), rows)


def test_a_run_with_nothing_to_send_never_waits(tmp_path: Path) -> None:
    rows = [(f"r{i}", f"text {i}") for i in range(12)]
    csv = _write(tmp_path / "in.csv", rows)
    out = tmp_path / "out"
    with FakeEmbeddingServer(dims=384) as server:
        done = run_cli(*_args(tmp_path, server, csv, "ledger.sqlite3"), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        # every chunk published, the manifest not written (lost here by hand), and another
        # host's ledger: the store alone says there is nothing to send
        run_key = _run_key(done.stdout)
        (out / "manifests" / f"{run_key}.json").unlink()
        _plant_lease(out, "a" * 64, age_s=5)
        again = run_cli(
            *_args(tmp_path, server, csv, "other.sqlite3", "--wait-for-live-run", "600"),
            cwd=tmp_path,
        )
        charged = server.charged_texts()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "waiting for" not in again.stderr
    assert max(charged.values()) == 1
    _check_output(out, run_key, rows)
