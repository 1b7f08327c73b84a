"""A run from a host whose clock is 20 minutes ahead or behind (libfaketime), on a local output
and on S3 (moto): its lease, the order of overlapping runs and a killed run's lease are judged
by the store's clock alone, so nothing is deleted under a live run and nothing is paid twice.

- gc with the true clock and ``--grace 0s`` while a skewed run embeds, and again while it is
  paused before its commit: the run's lease and its fresh chunk objects stay, the run commits.
  (gc skewed beside a true run: ``test_gc_clock.py``.)
- Two overlapping runs whose hosts disagree by 20 minutes: the later one by the store's clock
  waits and copies, whichever host's clock is off and in which direction.
- A run killed with ``kill -9`` on another host, resumed here with a skewed clock: the old
  lease holds it up while the store says it is live, and not once the store says it is stale,
  whatever the resumed run's clock says.

The fake server's charges per text (``charged_texts``) are the judge; moto runs in this
process, so the store's clock is the true one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.lease.held import LEASE_PREFIX, LEASE_SKEW_MARGIN_S, LEASE_TTL_S
from tasks.lease.overlap import lease_stem
from tests.integration.test_gc_clock import _libfaketime, _moto_age
from tests.integration.test_overlapping_runs import (
    Rows,
    _args,
    _check_output,
    _Output,
    _run_key,
    _sha,
    _start,
    _wait_for_requests,
    _write,
)
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

#: Old enough to be stale by the store's clock (TTL + margin), young enough that a clock 20
#: min behind would still take it for live.
_STALE_AGE_S = LEASE_TTL_S + LEASE_SKEW_MARGIN_S + 30


_SLEEP_SHIM = REPO / "tests/support/faketime"  # its sitecustomize: time.sleep that works


def _skewed(offset: str, *path: Path) -> dict[str, str]:
    """Variables that shift a subprocess's clock by ``offset`` (``+20m``, ``-20m``); file
    times stay the filesystem's, monotonic clocks stay real (as ``test_gc_clock._faked``).
    ``PYTHONPATH``: the sleep shim (``tests/support/faketime/sitecustomize.py``), ``path``,
    the repository."""
    return {
        "PYTHONPATH": ":".join(str(p) for p in (_SLEEP_SHIM, *path, REPO)),
        "LD_PRELOAD": _libfaketime(),
        "FAKETIME": offset,
        "NO_FAKE_STAT": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


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
@pytest.mark.parametrize("where", ["local", "s3"])
def test_gc_beside_a_run_whose_clock_is_20_minutes_off_keeps_its_lease_and_chunks(
    tmp_path: Path, where: str, offset: str, request: pytest.FixtureRequest
) -> None:
    rows = _rows(48)  # 8 chunks of 6, 24 requests of 2
    csv = _write(tmp_path / "in.csv", rows)
    out = _Output(tmp_path, request, where)
    gc_env = {**os.environ, "PYTHONPATH": str(REPO), **out.env}
    run_env = {
        **out.env,
        **_skewed(offset, REPO / "tests/support/signal_at"),
        "EMBEDLINE_TEST_SIGNALS": "before:tasks.commit.commit_run:commit_run:SIGSTOP",
    }

    def gc() -> str:
        done = subprocess.run(
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


@pytest.mark.parametrize(
    ("where", "skewed", "offset"),
    [
        ("local", "first", "+20m"),  # the earlier run's own clock says it started later
        ("local", "second", "-20m"),  # the later run's own clock says it started earlier
        ("s3", "first", "+20m"),
        ("s3", "second", "-20m"),
    ],
)
def test_overlapping_runs_whose_clocks_disagree_by_20_minutes_pay_once(
    tmp_path: Path, where: str, skewed: str, offset: str, request: pytest.FixtureRequest
) -> None:
    nightly = _rows(36)
    manual = nightly[12:] + _rows(6, " new")  # the next export: 24 rows as they were, 6 new
    first_csv = _write(tmp_path / "nightly.csv", nightly)
    second_csv = _write(tmp_path / "manual.csv", manual)
    out = _Output(tmp_path, request, where)
    clocks = {"first": {}, "second": {}, skewed: _skewed(offset)}
    with FakeEmbeddingServer(dims=384) as server:
        # the first run is slow (1 s a request) until the second has taken its lease, then
        # quick: the second starts while the first embeds, however slowly it starts
        server.fail_when(
            lambda payload: {"delay_s": 1.0 if len(_keys(out, LEASE_PREFIX)) < 2 else 0.2}
        )
        first = _start(
            _args(tmp_path, server, first_csv, "nightly.sqlite3", output=out.uri),
            tmp_path,
            {**out.env, **clocks["first"]},
        )
        try:
            _wait_for_requests(server, 1)
            # another host's ledger: only the store tells the second run about the first
            second = run_cli(
                *_args(tmp_path, server, second_csv, "manual.sqlite3", output=out.uri),
                cwd=tmp_path,
                env={**out.env, **clocks["second"]},
                timeout=120,
            )
            first_out, first_err = first.communicate(timeout=120)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
        charged = server.charged_texts()
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Traceback" not in first_err + second.stderr  # no thread died under the skew
    assert f"waiting for run {_run_key(first_out)[:12]}" in second.stderr, second.stderr[:6000]
    assert "no earlier run on this output is running now" in second.stderr
    texts = {_sha(t) for _, t in nightly} | {_sha(t) for _, t in manual}
    assert set(charged) == texts and max(charged.values()) == 1, charged.most_common(3)
    _check_output(out, _run_key(first_out), nightly)
    _check_output(out, _run_key(second.stdout), manual)
    assert _keys(out, LEASE_PREFIX) == set()


@pytest.mark.parametrize(
    ("offset", "old_lease"),
    [
        ("+20m", "live"),  # this host's clock would take it for 20 min old: stale
        ("-20m", "stale"),  # this host's clock would take it for renewed in the future: live
    ],
)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_run_resumed_with_a_skewed_clock_after_kill_9_judges_the_old_lease_by_the_store(
    tmp_path: Path, where: str, offset: str, old_lease: str, request: pytest.FixtureRequest
) -> None:
    rows = _rows(36)  # 6 chunks of 6, 18 requests of 2
    csv = _write(tmp_path / "in.csv", rows)
    out = _Output(tmp_path, request, where)
    with FakeEmbeddingServer(dims=384) as server:
        # killed (SIGKILL, its process group) as its 7th request arrives, before the server
        # answers it: every request answered before is in a published chunk object or kept
        # under _embedline/paid/ (the pause lets those writes land), so none is paid again
        killed: list[subprocess.Popen[str]] = []
        arrived = [0]
        lock = threading.Lock()

        def kill_at_the_7th(payload: object) -> dict[str, object] | None:
            with lock:
                arrived[0] += 1
                if arrived[0] != 7:
                    return None
            time.sleep(1.5)
            os.killpg(killed[0].pid, signal.SIGKILL)
            return {"status": 500}

        server.fail_when(kill_at_the_7th)
        killed.append(
            _start(
                _args(tmp_path, server, csv, "killed.sqlite3", output=out.uri), tmp_path, out.env
            )
        )
        try:
            killed[0].wait(timeout=120)
        finally:
            if killed[0].poll() is None:
                os.killpg(killed[0].pid, signal.SIGKILL)
                killed[0].wait()
        server.fail_when(None)
        assert killed[0].returncode == -signal.SIGKILL
        paid = server.charged_texts()
        assert sum(paid.values()) == 12 and max(paid.values()) == 1
        (old,) = _keys(out, LEASE_PREFIX)
        # as if the killed run was on another host: only the store's clock can say it is gone
        body = json.loads(out.get(old))
        body["holder"] = {"host": "0" * 16, "pid": 1}
        _set_lease(out, old, body, age_s=5 if old_lease == "live" else _STALE_AGE_S)
        # resumed in another container (no ledger) whose clock is 20 min off
        resumed = _start(
            _args(
                tmp_path,
                server,
                csv,
                "resumed.sqlite3",
                "--wait-for-live-run",
                "90",
                output=out.uri,
            ),
            tmp_path,
            {**out.env, **_skewed(offset)},
        )
        try:
            if old_lease == "live":
                _wait(
                    "the resumed run took its lease",
                    lambda: len({lease_stem(k) for k in _keys(out, LEASE_PREFIX)}) == 2,
                    resumed,
                )
                time.sleep(2.0)  # into its wait: it sends nothing while the store says live
                assert server.charged_texts() == paid
                _set_lease(out, old, body, age_s=_STALE_AGE_S)  # the store now says stale
            stdout, stderr = resumed.communicate(timeout=120)
        finally:
            if resumed.poll() is None:
                os.killpg(resumed.pid, signal.SIGKILL)
                resumed.wait()
        charged = server.charged_texts()
    assert resumed.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    if old_lease == "live":
        assert "waiting for another process of this run" in stderr, stderr[-3000:]
        assert "no earlier run on this output is running now" in stderr
    else:
        assert "waiting for" not in stderr, stderr[-3000:]
    assert set(charged) == {_sha(t) for _, t in rows} and max(charged.values()) == 1
    _check_output(out, _run_key(stdout), rows)
    assert _keys(out, LEASE_PREFIX) == {old}  # another host's lease: gc's to delete
