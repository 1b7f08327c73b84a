"""Which flexible checksum an S3 PUT carries, from botocore's own resolved setting, and the
hint a store's refusal gets (adapters/s3_checksums.py). Real botocore clients, no server."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.config import Config

from adapters.s3_checksums import (
    CHECKSUM_SETTING_HINT,
    RESPONSE_SETTING_HINT,
    checksum_hint,
    put_checksum_args,
)

B64 = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="


def _client(**config: Any) -> Any:
    return boto3.session.Session(
        aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1"
    ).client("s3", endpoint_url="http://127.0.0.1:9", config=Config(**config) if config else None)


def test_default_sends_sha256(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REQUEST_CHECKSUM_CALCULATION", raising=False)
    assert put_checksum_args(_client(), B64) == {"ChecksumSHA256": B64}


def test_env_when_required_sends_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")  # case-insensitive
    assert put_checksum_args(_client(), B64) == {}


def test_config_file_when_required_sends_none(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config").write_text("[default]\nrequest_checksum_calculation = when_required\n")
    monkeypatch.delenv("AWS_REQUEST_CHECKSUM_CALCULATION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assert put_checksum_args(_client(), B64) == {}


def test_botocore_config_when_required_sends_none() -> None:
    assert put_checksum_args(_client(request_checksum_calculation="when_required"), B64) == {}


@pytest.mark.parametrize(
    ("message", "hint"),
    [
        (
            "Unsupported header 'x-amz-checksum-sha256' received for this API call.",
            CHECKSUM_SETTING_HINT,
        ),
        ("Unsupported header 'x-amz-sdk-checksum-algorithm'", CHECKSUM_SETTING_HINT),
        ("Unsupported header 'x-amz-checksum-mode'", RESPONSE_SETTING_HINT),
        ("Invalid bucket name", ""),
    ],
)
def test_hint_names_the_setting(message: str, hint: str) -> None:
    assert checksum_hint(message) == hint
