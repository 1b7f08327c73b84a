"""``embedline gc`` from a host whose clock is 20 minutes ahead or behind (libfaketime), on a
local output and on S3 (moto): leases are judged by the store's clock alone.

A run pauses (SIGSTOP) with its chunk objects published and its manifest not yet written,
holding a fresh lease; a dead run's lease, stamped 30 min ago by the store (TTL 15 min), lists
an old chunk object. gc with ``--grace 0s`` and the clock shifted either way keeps the live
run's objects and collects the dead lease and its chunk; the paused run then commits without
paying again (the fake server's counters are the judge).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.object_store import open_store
from embedline.protocols import ObjectStore
from tasks.lease.held import LEASE_PREFIX, LEASE_TTL_S
from tests.integration.test_gc import _args, _rows, _wait_until_stopped, _write
from tests.support.clock import shifted_clock
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.forked_cli import popen_cli, run_cli_process
from tests.support.moto_server import moto_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

_DEAD_AGE_S = 30 * 60.0  # twice the lease TTL, by the store's clock


def _put(store: ObjectStore, key: str, body: bytes) -> None:
    store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="x")


def _plant_dead_run(
    store: ObjectStore, age: Callable[[str, float], None], digit: str
) -> tuple[str, str]:
    """A run killed long ago: its lease (stamped ``_DEAD_AGE_S`` ago by the store, its body
    written by a clock 40 min off) and the chunk object it alone listed; returns both keys."""
    dead = digit * 64
    chunk, lease = f"chunks/{dead}-0.parquet", f"{LEASE_PREFIX}{dead}.0123456789abcdef.000004.json"
    _put(store, chunk, b"a chunk of a run that died")
    skewed = time.time() + 40 * 60  # what its body says never matters
    _put(
        store,
        lease,
        json.dumps(
            {
                "run_key": dead,
                "started_at": skewed,
                "objects": [chunk],
                "ttl_s": LEASE_TTL_S,
                "expires_at": skewed + LEASE_TTL_S,
            }
        ).encode(),
    )
    age(chunk, 2 * 86400.0)
    age(lease, _DEAD_AGE_S)
    return chunk, lease


def _local_age(root: Path) -> Callable[[str, float], None]:
    def age(key: str, seconds: float) -> None:
        then = time.time() - seconds
        os.utime(root / key, (then, then))

    return age


def _moto_age(bucket: str, prefix: str) -> Callable[[str, float], None]:
    """Set a key's ``LastModified`` on the in-process moto server (its clock is this one)."""
    from moto.s3.models import s3_backends

    def age(key: str, seconds: float) -> None:
        partition, account = s3_backends.bucket_accounts[bucket]
        found = s3_backends[account][partition].get_bucket(bucket).keys[f"{prefix}/{key}"]
        then = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
        found.last_modified = then.replace(tzinfo=None)

    return age


def _keys(store: ObjectStore, prefix: str) -> set[str]:
    return {i.key for i in store.list(prefix)}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_gc_with_its_clock_20_minutes_off_keeps_a_live_run_and_collects_a_dead_lease(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    where: str,
    request: pytest.FixtureRequest,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if where == "local":
        output = str(tmp_path / "out")
        age = _local_age(tmp_path / "out")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = request.getfixturevalue("s3_bucket")
        env = {**moto_env(endpoint), "PYTHONPATH": str(REPO)}
        output = f"s3://{bucket}/emb"
        age = _moto_age(bucket, "emb")
    rows = _rows(60)  # 6 chunks of 10
    _write(tmp_path / "in.csv", rows)
    # The run pauses with its 6 chunk objects published, just before its commit
    paused = {
        **env,
        "PYTHONPATH": f"{REPO / 'tests/support/signal_at'}:{REPO}",
        "EMBEDLINE_TEST_SIGNALS": "before:tasks.commit.commit_run:commit_run:SIGSTOP",
    }
    running = popen_cli(
        [sys.executable, "-m", "cli", *_args(tmp_path, fake_openai, output)],
        cwd=tmp_path,
        env=paused,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    store = open_store(output) if where == "local" else _s3_store(output, env)
    try:
        _wait_until_stopped(running, "run")
        fresh = _keys(store, "chunks/")
        assert len(fresh) == 6 and len(_keys(store, LEASE_PREFIX)) == 1
        outputs = []
        for digit, offset in (("d", "+20m"), ("e", "-20m")):
            dead_chunk, dead_lease = _plant_dead_run(store, age, digit)
            gc = run_cli_process(
                [sys.executable, "-m", "cli", "gc", output, "--grace", "0s"],
                cwd=tmp_path,
                env={**env, **shifted_clock(offset)},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert gc.returncode == 0, gc.stderr[-3000:]
            outputs.append(gc.stdout)
            # the live run's fresh objects and its lease stay, whatever gc's clock says
            assert _keys(store, "chunks/") == fresh, (offset, gc.stdout)
            assert len(_keys(store, LEASE_PREFIX)) == 1, (offset, gc.stdout)
            # the dead run's lease is stale by the store's clock: it goes, with its chunk
            assert dead_lease not in _keys(store, LEASE_PREFIX), (offset, gc.stdout)
            assert dead_chunk not in _keys(store, "chunks/"), (offset, gc.stdout)
        running.send_signal(signal.SIGCONT)
        stdout, stderr = running.communicate(timeout=120)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    assert running.returncode == 0, stderr[-3000:]
    assert fake_openai.counters()["inputs"] == 60  # each text paid once
    manifest = next(line.split()[-1] for line in stdout.splitlines() if line.startswith("manifest"))
    assert manifest.endswith(".json") and _keys(store, LEASE_PREFIX) == set(), outputs


def _s3_store(output: str, env: dict[str, str]) -> Any:
    """The S3 store of ``output`` on the moto server of ``env`` (its endpoint)."""
    from adapters.object_store import S3Store
    from tests.support.moto_server import make_s3_client

    bucket, _, prefix = output[len("s3://") :].partition("/")
    return S3Store(bucket, prefix, client=make_s3_client(env["AWS_ENDPOINT_URL"]))
