"""A run killed with ``kill -9`` on another host, resumed here (another container, no ledger)
with a clock 20 minutes off, on a local output and on S3 (moto): the old lease holds it up
while the store says it is live and not once the store says it is stale, whatever the resumed
run's clock says; each text is paid once (helpers: ``test_run_clock.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tasks.lease.held import LEASE_PREFIX
from tasks.lease.overlap import lease_stem
from tests.integration.test_overlapping_runs import (
    _args,
    _check_output,
    _Output,
    _run_key,
    _sha,
    _start,
    _write,
)
from tests.integration.test_run_clock import (
    _STALE_AGE_S,
    _keys,
    _rows,
    _set_lease,
    _wait,
)
from tests.support.clock import shifted_clock
from tests.support.fake_openai import FakeEmbeddingServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]


@pytest.mark.parametrize(
    ("offset", "old_lease"),
    [
        ("+20m", "live"),  # this host's clock would take it for 20 min old: stale
        ("-20m", "stale"),  # this host's clock would take it for renewed in the future: live
    ],
)
@pytest.mark.parametrize(
    "where", ["local", pytest.param("s3", marks=pytest.mark.slow)]
)  # CI's 20-minute budget: make test-all runs it
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
            {**out.env, **shifted_clock(offset)},
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
