"""A run from a host whose clock is 20 minutes ahead or behind (libfaketime), on a local output
and on S3 (moto): its lease, the order of overlapping runs and a killed run's lease are judged
by the store's clock alone, so nothing is deleted under a live run and nothing is paid twice.

- gc with the true clock and ``--grace 0s`` while a skewed run embeds, and again while it is
  paused before its commit: the run's lease and its fresh chunk objects stay, the run commits.
  (gc skewed beside a true run: ``test_gc_clock.py``.)
- Two overlapping runs whose hosts disagree by 20 minutes: ``test_run_clock_overlap.py``.
- A run resumed with a skewed clock after ``kill -9``: ``test_run_clock_resume.py``.
(Three files, so ``--dist loadfile`` spreads them over the workers.)

The fake server's charges per text (``charged_texts``) are the judge; moto runs in this
process, so the store's clock is the true one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.lease.held import LEASE_PREFIX, LEASE_SKEW_MARGIN_S, LEASE_TTL_S
from tasks.lease.overlap import lease_stem
from tests.integration.test_gc_clock import _moto_age
from tests.integration.test_overlapping_runs import (
    Rows,
    _args,
    _check_output,
    _Output,
    _run_key,
    _sha,
    _start,
    _write,
)
from tests.support.clock import shifted_clock
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.forked_cli import run_cli_process

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

#: Old enough to be stale by the store's clock (TTL + margin), young enough that a clock 20
#: min behind would still take it for live.
_STALE_AGE_S = LEASE_TTL_S + LEASE_SKEW_MARGIN_S + 30


def _rows(n: int, tag: str = "") -> Rows:
    return [(f"r{i:03d}", f"clock text {i}{tag}") for i in range(n)]


def _keys(out: _Output, prefix: str) -> set[str]:
    """The objects under ``prefix``: a local writer's temp files (``.name.tmp-…``) left out."""
    return {k for k in out.keys(prefix) if not k.rsplit("/", 1)[-1].startswith(".")}


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def _wait(
    what: str, done: Callable[[], bool], proc: subprocess.Popen[str], timeout_s: float = 60
) -> None:
    """Poll ``done()`` until true while ``proc`` lives (``what`` names it in a failure)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _set_lease(out: _Output, key: str, body: dict[str, object], age_s: float) -> None:
    """Write lease ``key`` with ``body``, its ``LastModified`` ``age_s`` seconds ago by the
    store's clock (the true one: moto runs in this process)."""
    data = json.dumps(body).encode()
    if out.s3 is None:
        path = out.local / key
        path.write_bytes(data)
        then = time.time() - age_s
        os.utime(path, (then, then))
        return
    out.s3.put_object(Bucket=out.bucket, Key=f"emb/{key}", Body=data)
    _moto_age(out.bucket, "emb")(key, age_s)


@pytest.mark.parametrize("offset", ["+20m", "-20m"])
@pytest.mark.parametrize(
    "where", ["local", pytest.param("s3", marks=pytest.mark.slow)]
)  # CI's 20-minute budget: make test-all runs it
def test_gc_beside_a_run_whose_clock_is_20_minutes_off_keeps_its_lease_and_chunks(
    tmp_path: Path, where: str, offset: str, request: pytest.FixtureRequest
) -> None:
    rows = _rows(48)  # 8 chunks of 6, 24 requests of 2
    csv = _write(tmp_path / "in.csv", rows)
    out = _Output(tmp_path, request, where)
    gc_env = {**os.environ, "PYTHONPATH": str(REPO), **out.env}
    run_env = {
        **out.env,
        **shifted_clock(offset, REPO / "tests/support/signal_at"),
        "EMBEDLINE_TEST_SIGNALS": "before:tasks.commit.commit_run:commit_run:SIGSTOP",
    }

    def gc() -> str:
        done = run_cli_process(
            [sys.executable, "-m", "cli", "gc", out.uri, "--grace", "0s"],
            cwd=tmp_path,
            env=gc_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    with FakeEmbeddingServer(dims=384) as server:
        server.fail_when(lambda payload: {"delay_s": 0.3})  # 24 requests one at a time: ~8 s
        run = _start(
            _args(tmp_path, server, csv, "ledger.sqlite3", output=out.uri), tmp_path, run_env
        )
        try:
            # mid-embedding: some chunk objects published, more to come
            _wait("two chunks were published", lambda: len(_keys(out, "chunks/")) >= 2, run)
            leases = _keys(out, LEASE_PREFIX)
            assert len(leases) == 1
            published = _keys(out, "chunks/")
            said = [gc()]
            assert published <= _keys(out, "chunks/"), said
            # the run's lease (perhaps renewed: the same stem) is still there
            assert {lease_stem(k) for k in _keys(out, LEASE_PREFIX)} == {
                lease_stem(k) for k in leases
            }, said
            # paused before its commit: every chunk object published, the manifest not yet
            _wait("the run paused before its commit", lambda: _stopped(run.pid), run)
            published = _keys(out, "chunks/")
            assert len(published) == 8
            said.append(gc())
            assert _keys(out, "chunks/") == published, said
            assert len(_keys(out, LEASE_PREFIX)) == 1, said
            run.send_signal(signal.SIGCONT)
            stdout, stderr = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        charged = server.charged_texts()
    assert run.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]  # no thread died under the skewed clock
    assert set(charged) == {_sha(t) for _, t in rows} and max(charged.values()) == 1
    _check_output(out, _run_key(stdout), rows)
    assert _keys(out, LEASE_PREFIX) == set()
