"""A local output's temp files are judged by the filesystem's clock: a host whose clock runs
two hours ahead (libfaketime) never sweeps away a live writer's temp file as old."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.clock import shifted_clock

pytestmark = pytest.mark.integration

_SWEEP = """
import json, sys
from adapters.object_store.local import LocalDirStore
print(json.dumps(LocalDirStore(sys.argv[1]).sweep_temp_files(max_age_s=3600)))
"""


@pytest.mark.parametrize("offset", ["+2h", "-2h"])
def test_a_host_clock_hours_off_sweeps_by_the_filesystems_clock(
    tmp_path: Path, offset: str
) -> None:
    chunks = tmp_path / "out" / "chunks"
    chunks.mkdir(parents=True)
    live = os.getpid()  # this process: a writer still running on this host
    young = chunks / f".a.parquet.tmp-{live}-0123456789abcdef"  # 10 min old
    old = chunks / f".b.parquet.tmp-{live}-fedcba9876543210"  # 2 h old: a writer gone
    for path, age_s in ((young, 600), (old, 7200)):
        path.write_bytes(b"partial")
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    swept = subprocess.run(
        [sys.executable, "-c", _SWEEP, str(tmp_path / "out")],
        env={**os.environ, **shifted_clock(offset)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert swept.returncode == 0, swept.stderr[-2000:]
    assert young.exists(), f"a live writer's 10-minute-old temp file was swept ({offset})"
    assert not old.exists(), f"a 2-hour-old temp file was kept ({offset})"
    assert swept.stdout.strip() == f'["{old}"]'
