"""Two overlapping runs on one output whose hosts' clocks disagree by 20 minutes (one under
libfaketime), on a local output and on S3 (moto): the later one by the store's clock waits and
copies, whichever host's clock is off and in which direction; the fake server's charges per
text are the judge (helpers: ``test_run_clock.py``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tasks.lease.held import LEASE_PREFIX
from tests.integration.test_overlapping_runs import (
    _args,
    _check_output,
    _Output,
    _run_key,
    _sha,
    _start,
    _wait_for_requests,
    _write,
)
from tests.integration.test_run_clock import _keys, _rows
from tests.support.clock import shifted_clock
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]


@pytest.mark.parametrize(
    ("where", "skewed", "offset"),
    [
        ("local", "first", "+20m"),  # the earlier run's own clock says it started later
        ("local", "second", "-20m"),  # the later run's own clock says it started earlier
        # CI's 20-minute budget: make test-all runs these
        pytest.param("s3", "first", "+20m", marks=pytest.mark.slow),
        pytest.param("s3", "second", "-20m", marks=pytest.mark.slow),
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
    clocks = {"first": {}, "second": {}, skewed: shifted_clock(offset)}
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
