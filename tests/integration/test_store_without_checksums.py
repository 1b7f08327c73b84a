"""An S3-compatible store without flexible checksums (Backblaze B2 answers 400
``Unsupported header 'x-amz-checksum-sha256'``), as a loopback proxy in front of moto: the
run says the store's own message and which botocore setting to set (exit 3), and with
``AWS_REQUEST_CHECKSUM_CALCULATION=when_required`` it sends no flexible checksum and its
objects verify by their ``sha256`` metadata. Before, embedline always sent ``ChecksumSHA256``
and the message was only "the store rejected the request"."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli
from tests.support.moto_server import moto_env
from tests.support.s3_proxy import ResettingProxy

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

# The request headers of flexible checksums (botocore/httpchecksum.py). x-amz-checksum-mode
# (asking for a response checksum on GET) is not among them: a store without the feature
# ignores it, as it ignores any unknown x-amz- request header.
REFUSED = ("x-amz-checksum-crc", "x-amz-checksum-sha", "x-amz-sdk-checksum-algorithm")


def test_store_refusing_checksum_headers_says_so_and_when_required_completes(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
    s3_client: Any,
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{i},text {i}\n" for i in range(8)))
    with ResettingProxy(moto_endpoint, refuse_request_headers=REFUSED) as proxy:
        args = [
            "run",
            "in.csv",
            "--embedder",
            "openai",
            "--base-url",
            fake_openai.base_url,
            "--output",
            f"s3://{s3_bucket}/b2",
            "--ledger",
            "l.db",
            "--chunk-size",
            "3",
        ]
        env = moto_env(proxy.url)
        refused = run_cli(*args, cwd=tmp_path, env=env)
        said = refused.stdout + refused.stderr
        assert refused.returncode == 3, said[-3000:]
        assert "Unsupported header 'x-amz-checksum-sha256'" in said, said[-3000:]
        assert "AWS_REQUEST_CHECKSUM_CALCULATION=when_required" in said, said[-3000:]
        assert "Traceback" not in said
        assert fake_openai.counters()["requests"] == 0
        done = run_cli(
            *args, cwd=tmp_path, env={**env, "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required"}
        )
        assert done.returncode == 0, done.stderr[-3000:]
    puts = [status for method, _, status in proxy.seen if method == "PUT"]
    assert 400 in puts and puts[-1] == 200
    listed = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="b2/")["Contents"]
    keys = [o["Key"] for o in listed]
    assert any(k.startswith("b2/chunks/") for k in keys), keys
    assert any(k.startswith("b2/manifests/") for k in keys), keys
    for key in keys:
        got = s3_client.get_object(Bucket=s3_bucket, Key=key)
        assert got["Metadata"]["sha256"] == hashlib.sha256(got["Body"].read()).hexdigest(), key
