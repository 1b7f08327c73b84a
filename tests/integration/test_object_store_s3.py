"""S3Store against real S3 servers over HTTP on 127.0.0.1 (never real AWS).

What conditional writes promise (create-only puts, from bytes or streamed from a file, the 412
on a second create, sixteen racing creates, the start-up probe, reads and errors of a missing
bucket) runs on two servers, moto
and ministack (``conditional_s3_endpoint``, tests/support/s3_servers.py); the probe's answer
on a server that overwrites runs on s3rver.

Store-side behaviours moto cannot produce (409, 403, 501, 503 SlowDown) are injected with a
botocore ``before-send`` handler that answers in place of the server: the response still goes
through botocore's real parsing and retry logic. A store that ignores ``If-None-Match`` is
simulated by a ``before-parameter-build`` handler that drops the parameter, so the server
receives an unconditional PUT.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore
import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from adapters.object_store import (
    S3Store,
    check_conditional_writes,
    open_store,
    supports_if_none_match,
    translate_s3_error,
)
from embedline.errors import ConflictError, FatalError, RetryableError
from embedline.protocols import PutResult
from tests.support.moto_server import make_s3_client, moto_env
from tests.support.s3_servers import S3rver, make_bucket, shared_client

# Fixtures moto_endpoint, s3_bucket, s3_client come from tests/conftest.py
# (tests/support/moto_server.py).

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KEY = "chunks/abc.parquet"


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def put(store: S3Store, key: str, body: bytes) -> PutResult:
    return store.put_if_absent(key, body, sha256=sha(body), content_type="application/x")


class Wire:
    """Records PutObject traffic of a client: HTTP attempts and final statuses."""

    def __init__(self, client: Any, operation: str = "PutObject") -> None:
        self.requests: list[Any] = []
        self.statuses: list[int] = []
        self.injected: list[AWSResponse | None] = []
        client.meta.events.register(f"before-send.s3.{operation}", self._before_send)
        client.meta.events.register(f"after-call.s3.{operation}", self._after_call)

    def _before_send(self, request: Any, **_: Any) -> AWSResponse | None:
        self.requests.append(request)
        return self.injected.pop(0) if self.injected else None

    def _after_call(self, http_response: Any, **_: Any) -> None:
        self.statuses.append(http_response.status_code)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def error_response(status: int, code: str) -> AWSResponse:
    """An S3 XML error response, as a store would send it."""
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>injected</Message></Error>"
    ).encode()
    return AWSResponse("http://injected", status, {"Content-Type": "application/xml"}, _Raw(body))


@pytest.fixture
def store(moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Store]:
    """A store whose client is built the production way, from AWS_ENDPOINT_URL."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    slept: list[float] = []
    store = S3Store(s3_bucket, "runs/one", sleep=slept.append)
    store.slept = slept  # type: ignore[attr-defined]
    yield store
    store.client.close()


@pytest.fixture
def server_client(conditional_s3_endpoint: str) -> Any:
    """A boto3 client for moto, then for ministack (shared by the session)."""
    return shared_client(conditional_s3_endpoint)


@pytest.fixture
def server_bucket(conditional_s3_endpoint: str) -> str:
    """A fresh bucket on moto, then on ministack."""
    return make_bucket(conditional_s3_endpoint)


@pytest.fixture
def server_store(
    conditional_s3_endpoint: str, server_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[S3Store]:
    """Like ``store``, on moto, then on ministack."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", conditional_s3_endpoint)
    store = S3Store(server_bucket, "runs/one", sleep=[].append)
    yield store
    store.client.close()


# ------------------------------------------------------------------ create-only semantics


def test_put_creates_object_with_sha256_metadata_and_checksum(
    server_store: S3Store, server_client: Any, server_bucket: str
) -> None:
    wire = Wire(server_store.client)
    body = b"chunk bytes"

    result = put(server_store, KEY, body)

    assert result == PutResult(created=True, sha256=sha(body))
    head = server_client.head_object(Bucket=server_bucket, Key="runs/one/" + KEY)
    assert head["Metadata"] == {"sha256": sha(body)}
    assert head["ContentType"] == "application/x"
    headers = {k.lower(): v for k, v in wire.requests[0].headers.items()}
    assert headers["if-none-match"] == b"*"
    digest_b64 = base64.b64encode(hashlib.sha256(body).digest())
    assert headers["x-amz-checksum-sha256"] == digest_b64
    # An explicit checksum replaces botocore's default CRC32 rather than adding to it.
    assert "x-amz-checksum-crc32" not in headers
    assert "x-amz-sdk-checksum-algorithm" not in headers


def test_second_put_of_same_bytes_gets_one_412_and_reports_not_created(
    server_store: S3Store, server_client: Any, server_bucket: str
) -> None:
    put(server_store, KEY, b"same")
    before = server_client.head_object(Bucket=server_bucket, Key="runs/one/" + KEY)
    wire = Wire(server_store.client)

    result = put(server_store, KEY, b"same")

    assert result.created is False
    # Exactly one HTTP attempt, answered 412 (moto#10018 once turned this into retried 500s).
    assert len(wire.requests) == 1
    assert wire.statuses == [412]
    after = server_client.head_object(Bucket=server_bucket, Key="runs/one/" + KEY)
    assert (after["ETag"], after["LastModified"]) == (before["ETag"], before["LastModified"])


def test_put_of_other_bytes_raises_conflict_and_leaves_object(
    server_store: S3Store, server_client: Any, server_bucket: str
) -> None:
    put(server_store, KEY, b"original")

    with pytest.raises(ConflictError) as info:
        put(server_store, KEY, b"different")

    assert f"s3://{server_bucket}/runs/one/{KEY}" in str(info.value)
    assert info.value.exit_code == 3
    stored = server_client.get_object(Bucket=server_bucket, Key="runs/one/" + KEY)
    body = stored["Body"].read()
    assert body == b"original"


def test_object_without_sha256_metadata_is_a_conflict(
    server_store: S3Store, server_client: Any, server_bucket: str
) -> None:
    server_client.put_object(Bucket=server_bucket, Key="runs/one/" + KEY, Body=b"foreign")

    with pytest.raises(ConflictError, match="without sha256 metadata"):
        server_store.head_sha256(KEY)
    with pytest.raises(ConflictError):
        put(server_store, KEY, b"foreign")
    assert server_store.get(KEY) == b"foreign"


def test_sixteen_threads_racing_one_key_create_it_once(server_store: S3Store) -> None:
    body = b"y" * 50_000
    barrier = threading.Barrier(16)
    results: list[PutResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            result = put(server_store, KEY, body)
        except BaseException as exc:  # noqa: BLE001 - recorded and asserted below
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(result)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sum(r.created for r in results) == 1
    assert len(results) == 16
    assert server_store.get(KEY) == body


def test_head_sha256_and_get(server_store: S3Store) -> None:
    assert server_store.head_sha256(KEY) is None
    with pytest.raises(FileNotFoundError):
        server_store.get(KEY)

    put(server_store, KEY, b"payload")

    assert server_store.head_sha256(KEY) == sha(b"payload")
    assert server_store.get(KEY) == b"payload"


# ------------------------------------------------------------------ put_file_if_absent


def _file(tmp_path: Path, name: str, body: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(body)
    return path


def test_put_file_streams_the_file_with_sha256_metadata_and_checksum(
    server_store: S3Store, server_client: Any, server_bucket: str, tmp_path: Path
) -> None:
    body = os.urandom(3 << 20)  # several MiB read blocks
    wire = Wire(server_store.client)

    result = server_store.put_file_if_absent(
        KEY, _file(tmp_path, "body", body), content_type="application/x"
    )

    digest = hashlib.sha256(body)
    assert result == PutResult(created=True, sha256=digest.hexdigest())
    head = server_client.head_object(Bucket=server_bucket, Key="runs/one/" + KEY)
    assert (head["Metadata"], head["ContentType"]) == ({"sha256": sha(body)}, "application/x")
    assert server_store.get(KEY) == body
    headers = {k.lower(): v for k, v in wire.requests[0].headers.items()}
    assert headers["if-none-match"] == b"*"
    assert headers["x-amz-checksum-sha256"] == base64.b64encode(digest.digest())


def test_put_file_again_same_bytes_succeeds_other_bytes_conflict(
    server_store: S3Store, tmp_path: Path
) -> None:
    server_store.put_file_if_absent(KEY, _file(tmp_path, "a", b"first"), content_type="x")
    wire = Wire(server_store.client)

    again = server_store.put_file_if_absent(KEY, _file(tmp_path, "b", b"first"), content_type="x")
    with pytest.raises(ConflictError) as info:
        server_store.put_file_if_absent(KEY, _file(tmp_path, "c", b"second"), content_type="x")

    assert again == PutResult(created=False, sha256=sha(b"first"))
    assert wire.statuses == [412, 412]
    assert info.value.http_status == 412
    assert server_store.get(KEY) == b"first"


def test_put_file_of_a_missing_file_sends_nothing(server_store: S3Store, tmp_path: Path) -> None:
    wire = Wire(server_store.client)

    with pytest.raises(FileNotFoundError):
        server_store.put_file_if_absent(KEY, tmp_path / "missing", content_type="x")

    assert wire.requests == []
    assert server_store.head_sha256(KEY) is None


def test_missing_bucket_is_fatal_and_names_it(conditional_s3_endpoint: str) -> None:
    client = make_s3_client(conditional_s3_endpoint)
    store = S3Store("embedline-no-such-bucket", client=client)

    with pytest.raises(FatalError) as info:
        put(store, KEY, b"payload")

    assert "embedline-no-such-bucket" in str(info.value)
    assert "does not exist" in str(info.value)
    assert info.value.http_status == 404


# ------------------------------------------------------------------ the conditional-write probe


def test_check_conditional_writes_true_on_servers_that_refuse_overwrites(
    server_store: S3Store, server_client: Any, server_bucket: str
) -> None:
    assert check_conditional_writes(server_store) is True
    listed = server_client.list_objects_v2(Bucket=server_bucket, Prefix="runs/one/_embedline/")
    assert listed.get("KeyCount", 0) == 0  # scratch object deleted


def test_check_conditional_writes_false_on_s3rver_which_overwrites(
    s3rver_server: S3rver,
) -> None:
    client = s3rver_server.client()
    store = S3Store(s3rver_server.bucket, "probe", client=client)
    wire = Wire(client)

    assert check_conditional_writes(store) is False
    sent = [
        {k.lower(): v for k, v in r.headers.items()}.get("if-none-match") for r in wire.requests
    ]
    assert sent == [b"*", b"*"]  # both creates were conditional ...
    assert wire.statuses == [200, 200]  # ... and the second overwrote all the same
    listed = client.list_objects_v2(Bucket=s3rver_server.bucket, Prefix="probe/")
    assert listed.get("KeyCount", 0) == 0  # scratch object deleted
    client.close()


def test_check_conditional_writes_false_when_store_ignores_if_none_match(
    store: S3Store,
) -> None:
    dropped: list[str] = []

    def drop_condition(params: dict[str, Any], **_: Any) -> None:
        dropped.append(params.pop("IfNoneMatch"))

    store.client.meta.events.register("before-parameter-build.s3.PutObject", drop_condition)
    wire = Wire(store.client)

    assert check_conditional_writes(store) is False
    assert dropped == ["*", "*"]
    assert wire.statuses == [200, 200]  # the second create silently overwrote


# ------------------------------------------------------------------ injected store answers


def test_409_conditional_request_conflict_is_retried_then_succeeds(store: S3Store) -> None:
    wire = Wire(store.client)
    wire.injected = [error_response(409, "ConditionalRequestConflict")] * 2

    result = put(store, KEY, b"payload")

    assert result.created is True
    assert wire.statuses == [409, 409, 200]
    assert len(store.slept) == 2  # type: ignore[attr-defined]
    assert all(0 <= s <= 2.0 for s in store.slept)  # type: ignore[attr-defined]


def test_put_file_retried_after_409_sends_the_whole_file_again(
    store: S3Store, tmp_path: Path
) -> None:
    body = os.urandom(200_000)
    wire = Wire(store.client)
    wire.injected = [error_response(409, "ConditionalRequestConflict")] * 2

    result = store.put_file_if_absent(KEY, _file(tmp_path, "body", body), content_type="x")

    assert result.created is True
    assert wire.statuses == [409, 409, 200]
    assert store.get(KEY) == body


def test_409_that_persists_becomes_retryable_error(store: S3Store) -> None:
    wire = Wire(store.client)
    wire.injected = [error_response(409, "ConditionalRequestConflict")] * 10

    with pytest.raises(RetryableError) as info:
        put(store, KEY, b"payload")

    assert info.value.http_status == 409
    assert wire.statuses == [409] * 4  # conflict_attempts, each one HTTP request
    assert store.head_sha256(KEY) is None


def test_503_slowdown_is_retried_by_botocore_then_retryable(
    moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    store = S3Store(s3_bucket, max_attempts=2)
    wire = Wire(store.client)
    wire.injected = [error_response(503, "SlowDown")] * 2

    with pytest.raises(RetryableError) as info:
        put(store, KEY, b"payload")

    assert len(wire.requests) == 2  # botocore standard mode retried the 503 once
    assert info.value.http_status == 503


@pytest.mark.parametrize(
    ("status", "code", "expected", "fragment"),
    [
        (403, "AccessDenied", FatalError, "check the AWS credentials"),
        (403, "InvalidAccessKeyId", FatalError, "check the AWS credentials"),
        (403, "SignatureDoesNotMatch", FatalError, "check the AWS credentials"),
        (404, "NoSuchBucket", FatalError, "does not exist"),
        (501, "NotImplemented", FatalError, "does not implement conditional writes"),
        (400, "InvalidArgument", FatalError, "rejected the request"),
        (500, "InternalError", RetryableError, "failing or throttling"),
        (409, "ConditionalRequestConflict", RetryableError, "concurrent write"),
    ],
)
def test_store_errors_map_to_failure_classes(
    moto_endpoint: str,
    s3_bucket: str,
    status: int,
    code: str,
    expected: type[Exception],
    fragment: str,
) -> None:
    client = make_s3_client(moto_endpoint, retries={"mode": "standard", "total_max_attempts": 1})
    store = S3Store(s3_bucket, client=client, conflict_attempts=1)
    wire = Wire(client)
    wire.injected = [error_response(status, code)]

    with pytest.raises(expected) as info:
        put(store, KEY, b"payload")

    assert type(info.value) is expected
    assert fragment in str(info.value)
    assert s3_bucket in str(info.value)
    assert isinstance(info.value.__cause__, ClientError)
    assert "testing" not in str(info.value)  # never the (dummy) credentials


def test_connection_refused_is_retryable(s3_bucket: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = make_s3_client(
        f"http://127.0.0.1:{port}",
        connect_timeout=1,
        retries={"mode": "standard", "total_max_attempts": 1},
    )
    store = S3Store(s3_bucket, client=client)

    with pytest.raises(RetryableError, match="connection failed") as info:
        store.head_sha256(KEY)

    assert isinstance(info.value.__cause__, EndpointConnectionError)


def test_missing_credentials_are_fatal(
    moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)

    with pytest.raises(FatalError, match="no usable AWS credentials") as info:
        put(S3Store(s3_bucket), KEY, b"payload")

    assert isinstance(info.value.__cause__, NoCredentialsError)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ReadTimeoutError(endpoint_url="http://x"), RetryableError),
        (EndpointConnectionError(endpoint_url="http://x"), RetryableError),
        (NoCredentialsError(), FatalError),
        (ParamValidationError(report="bad"), type(None)),  # unknown: caller re-raises it
        (
            ClientError(
                {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}},
                "PutObject",
            ),
            RetryableError,
        ),
        (
            ClientError(
                {"Error": {"Code": "RequestTimeout"}, "ResponseMetadata": {"HTTPStatusCode": 400}},
                "PutObject",
            ),
            RetryableError,
        ),
        (
            ClientError(
                {"Error": {"Code": "ExpiredToken"}, "ResponseMetadata": {"HTTPStatusCode": 400}},
                "PutObject",
            ),
            FatalError,
        ),
    ],
)
def test_translate_s3_error_branches(exc: Exception, expected: type) -> None:
    translated = translate_s3_error(exc, bucket="b-x", what="PUT s3://b-x/k")
    assert type(translated) is expected


# ------------------------------------------------------------------ client construction


def _client_without_if_none_match(tmp_path: Path, endpoint: str) -> Any:
    """A real botocore client whose S3 model predates conditional writes (< 1.35.2)."""
    data = Path(botocore.__file__).parent / "data" / "s3" / "2006-03-01"
    gz = data / "service-2.json.gz"
    model = json.loads(
        gzip.decompress(gz.read_bytes()) if gz.exists() else (data / "service-2.json").read_bytes()
    )
    del model["shapes"]["PutObjectRequest"]["members"]["IfNoneMatch"]
    target = tmp_path / "models" / "s3" / "2006-03-01"
    target.mkdir(parents=True)
    (target / "service-2.json").write_text(json.dumps(model))
    session = botocore.session.Session()
    session.get_component("data_loader").search_paths.insert(0, str(tmp_path / "models"))
    return session.create_client("s3", endpoint_url=endpoint, region_name="us-east-1")


def test_old_botocore_without_if_none_match_is_refused(tmp_path: Path, moto_endpoint: str) -> None:
    old = _client_without_if_none_match(tmp_path, moto_endpoint)
    assert supports_if_none_match(old) is False
    assert supports_if_none_match(make_s3_client(moto_endpoint)) is True

    with pytest.raises(FatalError, match=r">= 1\.35\.2"):
        S3Store("any-bucket", client=old)


def test_store_pickles_without_its_client(store: S3Store) -> None:
    put(store, KEY, b"payload")

    copy = pickle.loads(pickle.dumps(store))

    assert copy.uri == store.uri
    assert copy._client is None
    assert copy.get(KEY) == b"payload"  # rebuilt from AWS_ENDPOINT_URL on first use


def test_subprocess_reaches_moto_through_aws_endpoint_url(
    moto_endpoint: str, s3_bucket: str, s3_client: Any
) -> None:
    code = (
        "import hashlib, sys\n"
        "from adapters.object_store import open_store\n"
        "store = open_store(sys.argv[1])\n"
        "body = b'from a child process'\n"
        "r = store.put_if_absent('chunks/child.parquet', body,"
        " sha256=hashlib.sha256(body).hexdigest(), content_type='application/x')\n"
        "print(store.client.meta.endpoint_url, r.created)\n"
    )
    env = moto_env(moto_endpoint)
    env["PYTHONPATH"] = str(REPO)

    proc = subprocess.run(
        [sys.executable, "-c", code, f"s3://{s3_bucket}/sub"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [moto_endpoint, "True"]
    body = s3_client.get_object(Bucket=s3_bucket, Key="sub/chunks/child.parquet")["Body"]
    assert body.read() == b"from a child process"


def test_open_store_s3_uses_prefix(
    moto_endpoint: str, s3_bucket: str, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    store = open_store(f"s3://{s3_bucket}/deep/prefix/")

    put(store, "manifests/r.json", b"{}")  # type: ignore[arg-type]

    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == ["deep/prefix/manifests/r.json"]


def test_get_from_missing_bucket_is_fatal_not_file_not_found(
    conditional_s3_endpoint: str,
) -> None:
    client = make_s3_client(conditional_s3_endpoint)
    store = S3Store("embedline-no-such-bucket", client=client)

    assert store.head_sha256(KEY) is None  # HEAD's bare 404 cannot tell bucket from key
    with pytest.raises(FatalError, match="does not exist"):
        store.get(KEY)


# ------------------------------------------------------------------ list, ranged reads, delete


def test_list_open_read_and_delete_stay_under_the_prefix(
    server_store: S3Store, server_client: Any, server_bucket: str
) -> None:
    body = bytes(range(256)) * 1024  # 256 KiB: larger than the first (tail) read
    put(server_store, "chunks/a.parquet", body)
    put(server_store, "chunks/b.parquet", b"small")
    server_client.put_object(Bucket=server_bucket, Key="runs/other/chunks/c.parquet", Body=b"x")
    listed = {i.key: i.size_bytes for i in server_store.list("chunks/")}
    assert listed == {"chunks/a.parquet": len(body), "chunks/b.parquet": 5}
    wire = Wire(server_store.client, "GetObject")
    with server_store.open_read("chunks/a.parquet") as fh:
        fh.seek(1000)
        assert fh.read(10) == body[1000:1010]
        fh.seek(-20, 2)
        assert fh.read() == body[-20:]
    ranges = [r.headers.get("Range") for r in wire.requests]
    assert ranges[0] == b"bytes=-65536" and len(ranges) == 2  # tail, then one range
    with server_store.open_read("chunks/b.parquet") as fh:
        assert fh.read() == b"small"
    with pytest.raises(FileNotFoundError):
        server_store.open_read("chunks/missing.parquet")
    server_store.delete("chunks/a.parquet")
    server_store.delete("chunks/a.parquet")  # already gone: not an error
    assert [i.key for i in server_store.list("chunks/")] == ["chunks/b.parquet"]


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses (hex, as in /proc/net/tcp*) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_test_servers_listen_on_loopback_only(
    ministack_endpoint: str, s3rver_server: S3rver
) -> None:
    # ministack and s3rver bind every interface unless told (BIND_HOST, -a)
    for endpoint in (ministack_endpoint, s3rver_server.endpoint):
        port = int(endpoint.rsplit(":", 1)[1])
        assert _listening_addresses(port) == {"0100007F"}, endpoint  # 127.0.0.1 only


def test_server_now_is_the_clock_that_stamps_last_modified(
    server_store: S3Store, caplog: pytest.LogCaptureFixture
) -> None:
    """gc judges lease ages by ``server_now`` (the response's ``Date``) against
    ``LastModified``: both come from the server, so whole seconds apart at most."""
    put(server_store, "_embedline/runs/r.o.000000.json", b"{}")
    (listed,) = server_store.list("_embedline/runs/")
    now = server_store.server_now()
    assert listed.modified - 1 <= now <= listed.modified + 5
    assert abs(now - time.time()) < 5  # the servers here share this host's clock
    assert "Date header" not in caplog.text  # the server sent one
