"""Publishing under races and ambiguity: an S3 write whose answer is lost, and two runs of
the same input at once. Each chunk object is created once and never overwritten."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from adapters.object_store import S3Store
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.output import read_local_output, vectors_by_id
from tests.support.s3_proxy import ResettingProxy
from tests.support.s3_servers import S3rver, make_bucket, shared_client

pytestmark = pytest.mark.integration


def test_ambiguous_first_write_is_resolved_by_412_and_checksum(
    moto_endpoint: str, s3_bucket: str
) -> None:
    dropped: list[str] = []

    def drop_first_put(method: str, path: str) -> bool:
        if method == "PUT" and "chunks/" in path and not dropped:
            dropped.append(path)
            return True
        return False

    with ResettingProxy(moto_endpoint, drop_first_put) as proxy:
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=proxy.url,
            config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
        )
        store = S3Store(s3_bucket, "p", client=client)
        body = b"parquet bytes"
        digest = hashlib.sha256(body).hexdigest()
        result = store.put_if_absent(
            "chunks/k.parquet", body, sha256=digest, content_type="application/octet-stream"
        )
    puts = [status for method, path, status in proxy.seen if method == "PUT"]
    assert puts == ["dropped", 412]  # stored, answer lost; the retry found it there
    assert result.sha256 == digest and result.created is False
    direct = boto3.client("s3", endpoint_url=moto_endpoint)
    stored = direct.get_object(Bucket=s3_bucket, Key="p/chunks/k.parquet")
    assert stored["Body"].read() == body and stored["Metadata"]["sha256"] == digest


def _start(
    tmp_path: Path, server: FakeEmbeddingServer, ledger: str, output: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    args = [
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        output,
        "--ledger",
        ledger,
        "--chunk-size",
        "3",
        "--concurrency",
        "2",
    ]
    return popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


class _Output:
    """Where the two runs publish: a local directory, or a fresh bucket on ministack."""

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest, kind: str) -> None:
        self.kind = kind
        if kind == "local":
            self.uri, self.env = str(tmp_path / "out"), {}
            return
        endpoint = request.getfixturevalue(f"{kind}_endpoint")
        self.bucket = make_bucket(endpoint)
        self.uri, self.env = f"s3://{self.bucket}/out", {"AWS_ENDPOINT_URL": endpoint}
        self.client = shared_client(endpoint)

    def chunk_objects(self) -> list[str]:
        if self.kind == "local":
            return [p.name for p in Path(self.uri).glob("chunks/*.parquet")]
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix="out/chunks/")
        return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".parquet")]

    def read(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(manifest, vectors by id), each object checked against the manifest."""
        if self.kind == "local":
            return read_local_output(Path(self.uri))
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix="out/manifests/")
        keys = [o["Key"] for o in listed.get("Contents", [])]
        assert len(keys) == 1, keys
        get = self.client.get_object
        manifest = json.loads(get(Bucket=self.bucket, Key=keys[0])["Body"].read())
        bodies = {
            e["object"]: get(Bucket=self.bucket, Key=f"out/{e['object']}")["Body"].read()
            for e in manifest["chunks"]
        }
        return manifest, vectors_by_id(bodies, manifest)


@pytest.mark.usefixtures("prefect_api_url")
@pytest.mark.parametrize(
    ("shared_ledger", "output"),
    [(True, "local"), (False, "local"), (False, "ministack")],
    ids=["one-ledger", "two-ledgers", "two-ledgers-ministack"],
)
def test_two_concurrent_runs_publish_each_chunk_once(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    shared_ledger: bool,
    output: str,
    request: pytest.FixtureRequest,
) -> None:
    """Two runs of one input at once; with two ledgers nothing but the store's conditional
    creates keeps them from overwriting each other (on ministack: a real S3 server's)."""
    rows = [(f"id{i:03d}", f"text number {i}") for i in range(30)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    fake_openai.fail_when(lambda payload: {"delay_s": 1.0})
    out = _Output(tmp_path, request, output)
    second = "a.sqlite3" if shared_ledger else "b.sqlite3"
    ledgers = [str(tmp_path / "a.sqlite3"), str(tmp_path / second)]
    first = _start(tmp_path, fake_openai, ledgers[0], out.uri, out.env)
    deadline = time.monotonic() + 120  # the second run starts while the first is mid-way
    while not out.chunk_objects() and time.monotonic() < deadline:
        time.sleep(0.05)
    procs = [first, _start(tmp_path, fake_openai, ledgers[1], out.uri, out.env)]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    manifest, vectors = out.read()
    assert set(vectors) == {r[0] for r in rows} and manifest["rows_published"] == 30
    assert len(out.chunk_objects()) == 10
    if shared_ledger:  # claims in one ledger: every row embedded exactly once in total
        assert fake_openai.counters()["inputs"] == 30
    # the first run started alone: chunks the second published meanwhile are not "before"
    assert "published of 30 (0 already published before" in results[0][0], results[0][0]


def _s3_error(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>{message}</Message></Error>"
    ).encode()


def _faulty_puts(statuses: list[tuple[int, bytes]]) -> object:
    queue = list(statuses)

    def fault(method: str, path: str) -> tuple[int, bytes] | None:
        return queue.pop(0) if method == "PUT" and "chunks/" in path and queue else None

    return fault


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        (
            [(503, _s3_error("SlowDown", "Please reduce your request rate."))] * 2,
            [503, 503, 200],
        ),  # retried by botocore's standard mode
        (
            [(409, _s3_error("ConditionalRequestConflict", "A conflicting operation"))],
            [409, 200],
        ),  # retried by the store adapter
    ],
    ids=["503-SlowDown", "409-ConditionalRequestConflict"],
)
def test_s3_server_faults_on_put_are_retried(
    moto_endpoint: str, s3_bucket: str, faults: list[tuple[int, bytes]], expected: list[int]
) -> None:
    with ResettingProxy(moto_endpoint, fault=_faulty_puts(faults)) as proxy:  # type: ignore[arg-type]
        client = boto3.session.Session().client("s3", endpoint_url=proxy.url)
        store = S3Store(s3_bucket, "f", client=client)
        body = b"chunk bytes"
        result = store.put_if_absent(
            "chunks/x.parquet",
            body,
            sha256=hashlib.sha256(body).hexdigest(),
            content_type="application/octet-stream",
        )
    assert result.created is True
    assert [status for method, _, status in proxy.seen if method == "PUT"] == expected


@pytest.mark.usefixtures("prefect_api_url")
def test_store_ignoring_if_none_match_is_refused_unless_overridden(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n1,a\n2,b\n")
    with ResettingProxy(moto_endpoint, strip_request_headers=("If-None-Match",)) as proxy:
        args = [
            "run",
            str(tmp_path / "in.csv"),
            "--embedder",
            "openai",
            "--base-url",
            fake_openai.base_url,
            "--output",
            f"s3://{s3_bucket}/u",
            "--ledger",
            str(tmp_path / "l.sqlite3"),
        ]
        env = {"AWS_ENDPOINT_URL": proxy.url}
        refused = run_cli(*args, cwd=tmp_path, env=env)
        assert refused.returncode == 3
        assert "does not enforce conditional writes" in refused.stdout + refused.stderr
        assert fake_openai.counters()["requests"] == 0
        allowed = run_cli(*args, "--allow-unconditional-store", cwd=tmp_path, env=env)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "RUNNING ANYWAY" in allowed.stderr


@pytest.mark.usefixtures("prefect_api_url")
def test_s3rver_which_overwrites_is_refused_at_start_up(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, s3rver_server: S3rver
) -> None:
    """A real S3 server that ignores If-None-Match (npm s3rver): the CLI's start-up probe
    sees its scratch object overwritten and exits 3 with one line that says what to do,
    before any embedding request, leaving no object behind."""
    (tmp_path / "in.csv").write_text("id,text\n1,a\n2,b\n")
    prefix = f"refused-{tmp_path.name}"
    result = run_cli(
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        f"s3://{s3rver_server.bucket}/{prefix}",
        "--ledger",
        str(tmp_path / "l.sqlite3"),
        cwd=tmp_path,
        env=s3rver_server.env(),
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1, result.stderr  # one line, which says what to do
    assert result.stderr.startswith("embedline: error: ")
    assert "does not enforce conditional writes (If-None-Match: *)" in result.stderr
    assert "use a store that does, or pass --allow-unconditional-store" in result.stderr
    assert "status     fatal" in result.stdout
    assert fake_openai.counters()["requests"] == 0
    client = s3rver_server.client()
    listed = client.list_objects_v2(Bucket=s3rver_server.bucket, Prefix=f"{prefix}/")
    assert listed.get("KeyCount", 0) == 0
    client.close()
