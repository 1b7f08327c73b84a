"""The S3 store: create-only writes by ``PutObject`` with ``If-None-Match: *``
(docs/reference/output-layout.md).

S3 answers 412 Precondition Failed when the key exists, and 409 ConditionalRequestConflict
when a concurrent operation on the key is in progress ("On a 409 failure you should retry").
Sources: AWS S3 user guide, "How to prevent object overwrites with conditional writes"
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html), the
PutObject API reference, RFC 9110 §13.1.2 (If-None-Match) and §15.5.13 (412). Conditional
writes need SigV4 or HTTPS; boto3 signs with SigV4. botocore's errors are translated by
``adapters.object_store.s3_errors.s3_errors`` around every call.
"""

from __future__ import annotations

import base64
import builtins
import datetime
import email.utils
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, BinaryIO

from adapters.object_store.common import (
    check_key,
    check_scratch_key,
    require_digest,
    sha256_file,
)
from adapters.object_store.conditional import existing_result
from adapters.object_store.s3_errors import KeyExists, s3_errors
from adapters.s3_checksums import put_checksum_args
from embedline.errors import ConflictError, FatalError, RetryableError
from embedline.protocols import ObjectInfo, PutResult

__all__ = ["S3Store", "supports_if_none_match"]

logger = logging.getLogger("embedline")

_TAIL_BYTES = 1 << 16  # bytes of an object's end fetched first by ``S3Store.open_read``


def supports_if_none_match(client: Any) -> bool:
    """Return True if the botocore S3 model of ``client`` has ``PutObject.IfNoneMatch``.

    The parameter arrived with botocore 1.35.2 / boto3 1.35.2 ("Amazon Simple
    Storage Service / Features : Add support for conditional writes for PutObject and
    CompleteMultipartUpload APIs"); older botocore rejects it with ParamValidationError.
    """
    shape = client.meta.service_model.operation_model("PutObject").input_shape
    return "IfNoneMatch" in shape.members


def _build_client(
    *, connect_timeout_s: float, read_timeout_s: float, max_attempts: int, max_pool: int
) -> Any:
    """Build an S3 client from the standard AWS chain (env, profile, role; endpoint too).

    botocore itself reads ``AWS_ENDPOINT_URL_S3`` then ``AWS_ENDPOINT_URL`` (then the
    profile's ``endpoint_url``), see botocore/configprovider.py ``EndpointConfigProvider``
    and the AWS SDKs reference guide "Service-specific endpoints".
    """
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        max_pool_connections=max_pool,
    )
    # A private Session: boto3's default session is not safe to share across threads.
    return boto3.session.Session().client("s3", config=config)


class S3Store:
    """A bucket (and optional key prefix) with create-only writes via ``If-None-Match: *``.

    The boto3 client is built on first use from the standard AWS configuration unless one is
    injected. Retries: botocore's ``standard`` mode (``max_attempts`` in total, including
    the first; it retries 500/502/503/504, 429, throttling codes such as ``SlowDown``,
    ``RequestTimeout`` and connection errors, with jittered exponential backoff); this class
    retries only 409 ConditionalRequestConflict, which botocore does not retry.
    Units: seconds for timeouts and backoff.

    Every object gets user metadata ``sha256`` (hex of the body) and ``ChecksumSHA256``
    (base64 of the digest; S3 verifies it). Giving an explicit checksum makes botocore skip
    its default CRC32 (it only adds one when no ``x-amz-checksum-*`` header is present).
    Under botocore's ``request_checksum_calculation = when_required`` no flexible checksum
    is sent at all (``adapters.s3_checksums``); the metadata still verifies every read.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        max_attempts: int = 5,
        max_pool_connections: int = 32,
        conflict_attempts: int = 4,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid bucket name {bucket!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_attempts = max_attempts
        self.max_pool_connections = max_pool_connections
        self._conflict_attempts = conflict_attempts
        self._sleep = sleep
        self._lock = threading.Lock()
        self._client: Any | None = None
        if client is not None:
            self._client = self._checked(client)

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Clients and locks do not pickle; a copy (e.g. on a Dask worker) builds its own.
        state = self.__dict__.copy()
        state["_client"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 S3 client (built on first use; thread-safe once built)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._checked(
                        _build_client(
                            connect_timeout_s=self.connect_timeout_s,
                            read_timeout_s=self.read_timeout_s,
                            max_attempts=self.max_attempts,
                            max_pool=self.max_pool_connections,
                        )
                    )
        return self._client

    def _checked(self, client: Any) -> Any:
        if not supports_if_none_match(client):
            import botocore

            raise FatalError(
                f"botocore {botocore.__version__} cannot send PutObject If-None-Match, needed "
                f"for create-only writes to {self.uri}; upgrade to boto3/botocore >= 1.35.2"
            )
        return client

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri_for(self, key: str) -> str:
        """Return ``s3://bucket/prefix/key``. :raises ValueError: bad key."""
        return f"s3://{self.bucket}/{self._key(key)}"

    def put_if_absent(self, key: str, body: bytes, *, sha256: str, content_type: str) -> PutResult:
        """Create ``key`` with ``body`` (bytes) unless it exists; never overwrite.

        412 Precondition Failed (the key exists, RFC 9110 §15.5.13) is resolved with a HEAD:
        the stored ``sha256`` metadata equal to ours → ``created=False`` (this also covers a
        PUT that succeeded but whose response was lost and retried by botocore).

        :raises ValueError: ``sha256`` is not the SHA-256 of ``body``, or the key is invalid.
        :raises ConflictError: the key holds other bytes, or an object without our metadata.
        :raises RetryableError: 409 still conflicting after ``conflict_attempts`` tries;
            5xx/throttling/timeouts left after botocore's retries.
        :raises FatalError: missing bucket, refused credentials, no conditional writes.
        Rule source: AWS S3 user guide, "conditional writes" (412 exists, 409 retry).
        """
        require_digest(body, sha256)
        return self._put(key, body, sha256, content_type)

    def put_file_if_absent(
        self, key: str, path: str | os.PathLike[str], *, content_type: str
    ) -> PutResult:
        """Create ``key`` holding the bytes of the local file ``path`` unless it exists;
        never overwrite. The file is read twice, never held in memory: once for its
        SHA-256 (the ``sha256`` metadata and ``ChecksumSHA256``), once streamed as the
        ``PutObject`` body (one request: up to S3's 5 GiB single-PUT limit).

        :raises FileNotFoundError: ``path`` does not exist.
        Other errors: as ``put_if_absent``.
        """
        return self._put(key, Path(path), sha256_file(path), content_type)

    def _put(self, key: str, body: bytes | Path, sha256: str, content_type: str) -> PutResult:
        """``_put_once``, again on 409 ConditionalRequestConflict."""
        from tenacity import (
            Retrying,
            retry_if_exception,
            stop_after_attempt,
            wait_random_exponential,
        )

        retrying = Retrying(
            stop=stop_after_attempt(self._conflict_attempts),
            wait=wait_random_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception(_is_conditional_conflict),
            sleep=self._sleep,
            before_sleep=_log_conflict_retry,
            reraise=True,
        )
        return retrying(self._put_once, key, body, sha256, content_type)

    def _errors(self, what: str, **options: Any) -> AbstractContextManager[None]:
        """``s3_errors`` for this bucket: the one place botocore's errors are translated."""
        return s3_errors(bucket=self.bucket, what=what, **options)

    def _put_once(self, key: str, body: bytes | Path, sha256: str, content_type: str) -> PutResult:
        """One conditional ``PutObject`` of ``body`` (bytes, or a local file opened for
        this attempt: botocore rewinds it for its own retries)."""
        digest_b64 = base64.b64encode(bytes.fromhex(sha256)).decode("ascii")
        try:
            with ExitStack() as stack:
                payload = stack.enter_context(open(body, "rb")) if isinstance(body, Path) else body
                with self._errors(f"PUT {self.uri_for(key)}", exists=True):
                    self.client.put_object(
                        Bucket=self.bucket,
                        Key=self._key(key),
                        Body=payload,
                        ContentType=content_type,
                        IfNoneMatch="*",
                        Metadata={"sha256": sha256},
                        **put_checksum_args(self.client, digest_b64),
                    )
        except KeyExists:
            return self._existing_result(key, sha256)
        logger.info("S3 PUT %s: created", self.uri_for(key))
        return PutResult(created=True, sha256=sha256)

    def _existing_result(self, key: str, sha256: str) -> PutResult:
        stored = self.head_sha256(key)
        if stored is None:
            raise RetryableError(
                f"PUT {self.uri_for(key)}: 412 but the object is gone; retry", http_status=412
            )
        result = existing_result(
            self.uri_for(key), stored, sha256, fix="use a fresh --output prefix", http_status=412
        )
        logger.info("S3 PUT %s: exists with identical bytes (412)", self.uri_for(key))
        return result

    def head_sha256(self, key: str) -> str | None:
        """Return the object's ``sha256`` metadata (hex), or None on 404.

        A HEAD response has no body, so a missing bucket also reads as 404 → None here; the
        following ``put_if_absent`` then raises ``FatalError`` naming the bucket.

        :raises ConflictError: the object exists but carries no ``sha256`` metadata (it was
            not written by embedline, and is never replaced).
        :raises RetryableError, FatalError: as ``put_if_absent``.
        """
        uri = self.uri_for(key)
        try:
            with self._errors(f"HEAD {uri}", missing=uri):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError:
            return None
        stored = head.get("Metadata", {}).get("sha256")
        if not stored:
            raise ConflictError(
                f"{self.uri_for(key)} exists without sha256 metadata (not "
                "written by embedline); it is never overwritten"
            )
        return str(stored)

    def get(self, key: str) -> bytes:
        """Return the object's bytes. :raises FileNotFoundError: if the key does not exist."""
        uri = self.uri_for(key)
        with self._errors(f"GET {uri}", missing=uri):
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return bytes(response["Body"].read())

    def open_read(self, key: str) -> BinaryIO:
        """Return a seekable binary file over ``key`` that reads by HTTP ranges, so a Parquet
        reader fetches only the footer and the columns it needs.

        The first request asks for the object's last ``_TAIL_BYTES`` (a suffix range, RFC
        9110 §14.1.1): its ``Content-Range`` gives the size and it holds the Parquet footer.
        Later ranges are pinned to the first answer's ETag (``If-Match``).

        :raises FileNotFoundError: if the key does not exist.
        """
        uri = self.uri_for(key)
        with self._errors(f"GET {uri}", missing=uri):
            response = self.client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes=-{_TAIL_BYTES}"
            )
            tail = bytes(response["Body"].read())
        content_range = str(response.get("ContentRange") or "")
        size = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else len(tail)
        raw = _S3RangeReader(self, key, size, response.get("ETag"), tail)
        return io.BufferedReader(raw, buffer_size=1 << 16)

    def _get_range(self, key: str, start: int, stop: int, etag: str | None) -> bytes:
        """Bytes ``[start, stop)`` of ``key``; ``etag`` pins the version that was opened."""
        extra = {"IfMatch": etag} if etag else {}
        uri = self.uri_for(key)
        with self._errors(f"GET {uri}", missing=uri):
            response = self.client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{stop - 1}", **extra
            )
            return bytes(response["Body"].read())

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Yield the objects whose key starts with ``prefix`` (``ListObjectsV2``, paginated)."""
        root = f"{self.prefix}/" if self.prefix else ""
        # not uri_for: a prefix such as "chunks/" is no valid key
        with self._errors(f"LIST s3://{self.bucket}/{root}{prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    yield ObjectInfo(
                        item["Key"][len(root) :],
                        int(item["Size"]),
                        item["LastModified"].timestamp(),
                    )

    def server_now(self) -> float:
        """The S3 server's clock now (Unix s): the ``Date`` header of a one-key
        ``ListObjectsV2`` under the root (whole seconds, RFC 9110 §6.6.1), the clock that
        stamps ``LastModified``. A response without one: this host's clock, with a warning.
        """
        root = f"{self.prefix}/" if self.prefix else ""
        with self._errors(f"LIST s3://{self.bucket}/{root}"):
            response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=root, MaxKeys=1)
        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            when = email.utils.parsedate_to_datetime(date)
            return when.replace(tzinfo=when.tzinfo or datetime.UTC).timestamp()
        except (TypeError, ValueError):
            logger.warning("%s sent no Date header: judging ages by this host's clock", self.uri)
            return time.time()

    def delete(self, key: str) -> None:
        """Delete ``key`` (garbage collection only; a missing key is not an error)."""
        with self._errors(f"DELETE {self.uri_for(key)}"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def prepare(self) -> None:
        """Nothing to create: embedline never creates a bucket. A missing bucket or refused
        credentials answer the run's first request (``FatalError``)."""

    def sweep_temp_files(
        self, max_age_s: float = 3600.0, *, now: float | None = None
    ) -> builtins.list[str]:
        """Return ``[]``: a PUT is atomic on S3, so no writer leaves a temp object behind."""
        return []

    def discard_scratch(self, key: str) -> None:
        """Delete a scratch key under ``_embedline/`` (best effort); other keys: ValueError.

        Chunk and manifest objects are never deleted; this exists for the conditional-write
        probe's own scratch object only.
        """
        check_scratch_key(key)
        with self._errors(self.uri_for(key), warning="could not delete scratch object %s: %s"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


class _S3RangeReader(io.RawIOBase):
    """A read-only, seekable raw file over one S3 object, one ranged GET per ``readinto``."""

    def __init__(self, store: S3Store, key: str, size: int, etag: str | None, tail: bytes) -> None:
        self._store, self._key, self._size, self._etag = store, key, size, etag
        self._tail, self._tail_start = tail, size - len(tail)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        stop = min(self._size, self._pos + len(buffer))
        if stop <= self._pos:
            return 0
        if self._pos >= self._tail_start:
            data = self._tail[self._pos - self._tail_start : stop - self._tail_start]
        else:
            data = self._store._get_range(self._key, self._pos, stop, self._etag)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _is_conditional_conflict(exc: BaseException) -> bool:
    return isinstance(exc, RetryableError) and exc.http_status == 409


def _log_conflict_retry(retry_state: Any) -> None:
    seconds = retry_state.next_action.sleep if retry_state.next_action else 0.0
    logger.warning(
        "S3 409 ConditionalRequestConflict; retrying in %.2f s (attempt %d)",
        seconds,
        retry_state.attempt_number,
    )
