"""The one translation point for botocore's errors (``adapters.object_store.s3_errors``).

No sockets: botocore exceptions are built by hand, as botocore raises them.
"""

from __future__ import annotations

import logging

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from adapters.object_store.s3_errors import KeyExists, s3_errors
from embedline.errors import FatalError, RetryableError


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def test_412_on_a_create_is_key_exists() -> None:
    with pytest.raises(KeyExists), s3_errors(bucket="b", what="PUT s3://b/k", exists=True):
        raise client_error("PreconditionFailed", 412)


def test_412_elsewhere_is_fatal() -> None:  # a ranged GET whose If-Match no longer holds
    with (
        pytest.raises(FatalError, match="GET s3://b/k: PreconditionFailed"),
        s3_errors(bucket="b", what="GET s3://b/k"),
    ):
        raise client_error("PreconditionFailed", 412)


def test_404_is_file_not_found_only_where_asked() -> None:
    with (
        pytest.raises(FileNotFoundError) as info,
        s3_errors(bucket="b", what="GET s3://b/k", missing="s3://b/k"),
    ):
        raise client_error("NoSuchKey", 404)
    assert info.value.filename == "s3://b/k"
    with pytest.raises(FatalError), s3_errors(bucket="b", what="LIST s3://b/"):
        raise client_error("NoSuchKey", 404)


def test_no_such_bucket_is_fatal_even_on_a_read() -> None:
    with (
        pytest.raises(FatalError, match="bucket 'b' does not exist"),
        s3_errors(bucket="b", what="GET s3://b/k", missing="s3://b/k"),
    ):
        raise client_error("NoSuchBucket", 404)


def test_409_and_connection_errors_are_retryable() -> None:
    with pytest.raises(RetryableError) as info, s3_errors(bucket="b", what="PUT s3://b/k"):
        raise client_error("ConditionalRequestConflict", 409)
    assert info.value.http_status == 409
    with (
        pytest.raises(RetryableError, match="connection failed"),
        s3_errors(bucket="b", what="PUT s3://b/k"),
    ):
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")


def test_translated_error_keeps_the_botocore_cause() -> None:
    with pytest.raises(FatalError) as info, s3_errors(bucket="b", what="PUT s3://b/k"):
        raise client_error("AccessDenied", 403)
    assert isinstance(info.value.__cause__, ClientError)


def test_warning_mode_logs_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.WARNING, "embedline"),
        s3_errors(bucket="b", what="s3://b/_embedline/x", warning="could not delete %s: %s"),
    ):
        raise client_error("AccessDenied", 403)
    assert caplog.messages == ["could not delete s3://b/_embedline/x: ClientError"]


def test_other_exceptions_pass_through_unchanged() -> None:
    with pytest.raises(KeyError), s3_errors(bucket="b", what="GET s3://b/k"):
        raise KeyError("not botocore")
