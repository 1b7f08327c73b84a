"""Object stores with create-only writes: a local directory and S3 (DESIGN §4).

Both stores give the same contract (``embedline.protocols.ObjectStore``): ``put_if_absent``
creates a key or finds it already holding the same bytes (SHA-256 equal → ``created=False``);
a key holding other bytes raises ``ConflictError`` and is never overwritten or deleted.

- ``LocalDirStore``: temp file in the target's directory, fsync, ``os.link`` into place
  (``link(2)`` fails with EEXIST if the name exists), fsync the directory.
- ``S3Store``: ``PutObject`` with ``If-None-Match: *``. S3 answers 412 Precondition Failed
  when the key exists, and 409 ConditionalRequestConflict when a concurrent operation on the
  key is in progress ("On a 409 failure you should retry"). Sources: AWS S3 user guide, "How
  to prevent object overwrites with conditional writes"
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html), the
  PutObject API reference, RFC 9110 §13.1.2 (If-None-Match) and §15.5.13 (412). Conditional
  writes need SigV4 or HTTPS; boto3 signs with SigV4.

Third-party errors are translated here and nowhere else (``translate_s3_error``,
``_translate_os_error``); adapters never import prefect.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import io
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from adapters.disk_full import full_error, is_disk_full
from adapters.processes import local_process_is_gone
from adapters.s3_checksums import checksum_hint, put_checksum_args, store_message
from adapters.uris import redact, split_location
from embedline.errors import (
    ConflictError,
    EmbedlineError,
    FatalError,
    InputError,
    RetryableError,
)
from embedline.protocols import ObjectInfo, ObjectStore, PutResult

__all__ = [
    "LocalDirStore",
    "S3Store",
    "check_conditional_writes",
    "open_store",
    "supports_if_none_match",
    "translate_s3_error",
]

logger = logging.getLogger("embedline")

#: Scratch keys (``check_conditional_writes``) live under this prefix; only they may be deleted.
SCRATCH_PREFIX = "_embedline/"

#: Temp files are named ``.{name}.tmp-{pid}-{16 hex}`` so ``sweep_temp_files`` can find them.
_TEMP_RE = re.compile(r"^\..+\.tmp-(?P<pid>\d+)-[0-9a-f]{16}$")

_READ_BLOCK = 1 << 20  # bytes per read when hashing a file
_TAIL_BYTES = 1 << 16  # bytes of an object's end fetched first by ``S3Store.open_read``

_ACCEPTED_FORMS = (
    "accepted forms: s3://bucket or s3://bucket/prefix, file:///absolute/path, "
    "or a plain directory path"
)


# --------------------------------------------------------------------------- helpers


def _sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _require_digest(body: bytes, sha256: str) -> None:
    """Raise ValueError unless ``sha256`` is the lowercase hex SHA-256 of ``body``.

    A mismatch is a programming error in the caller, not a store failure.
    """
    actual = _sha256_hex(body)
    if sha256 != actual:
        raise ValueError(f"sha256 argument {sha256!r} does not match the body ({actual})")


def _check_key(key: str) -> str:
    """Return ``key`` if it is a relative, normalized ``/``-separated key; else ValueError.

    Rejected: empty keys, absolute paths, ``.``/``..``/empty segments, backslashes, NUL.
    """
    if not isinstance(key, str) or not key:
        raise ValueError("object key must be a non-empty string")
    if key.startswith("/") or os.path.isabs(key):
        raise ValueError(f"object key {key!r} must be relative, not absolute")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"object key {key!r} must not contain backslashes or NUL")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"object key {key!r} must not contain '.', '..' or empty segments")
    return key


# --------------------------------------------------------------------------- local directory


def _translate_os_error(exc: OSError, path: str) -> EmbedlineError | None:
    """Map a filesystem error to a failure class; None means "unknown, re-raise as is"."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return FatalError(f"cannot write {path}: {exc.strerror}; check the output directory's "
                          "permissions and that its filesystem is writable")
    if is_disk_full(exc):  # exit 1: a rerun after freeing space resumes (adapters.disk_full)
        return full_error(path, "output")
    if exc.errno in (errno.ENOTDIR, errno.EISDIR):
        return FatalError(f"cannot write {path}: {exc.strerror}; a file stands where the "
                          "output layout needs a directory (or the reverse)")
    if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
        return FatalError(f"cannot create {path}: {exc.strerror}; the output filesystem does "
                          "not support hard links, which create-only writes need")
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_READ_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _writer_is_dead(temp_name: str) -> bool:
    """True if the pid in a temp file's name is not a live process of this host."""
    match = _TEMP_RE.match(temp_name)
    return match is not None and local_process_is_gone(int(match.group("pid")))


class LocalDirStore:
    """A directory on a local (POSIX) filesystem with create-only writes.

    Keys map to paths under ``root``; ``uri`` is the absolute path of ``root``. A write is a
    temp file ``.{name}.tmp-{pid}-{random}`` in the target's directory, fsynced, then
    ``os.link``-ed to the target name (``link(2)`` never replaces an existing name), then the
    directory is fsynced. The temp file is always unlinked; only a ``kill -9`` between the
    write and the unlink can leave one, and ``sweep_temp_files`` removes those.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(os.fspath(root)))
        self.uri = str(self.root)

    def __repr__(self) -> str:
        return f"LocalDirStore({self.uri!r})"

    def prepare(self) -> None:
        """Create the output directory if needed.

        :raises InputError: (exit 2) the path exists but is not a directory, or cannot be
            created (permissions, a file in the way, a read-only file system).
        """
        if self.root.exists() and not self.root.is_dir():
            raise InputError(f"--output {self.uri} exists and is not a directory; "
                             "choose a directory path")  # fmt: skip
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--output {self.uri} cannot be created: {exc.strerror}; "
                             "choose a writable directory") from None  # fmt: skip
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise InputError(f"--output {self.uri} is not writable; choose a writable directory")

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*_check_key(key).split("/"))

    def uri_for(self, key: str) -> str:
        """Return the absolute path of ``key`` as a string. :raises ValueError: bad key."""
        return str(self._path(key))

    def put_if_absent(
        self, key: str, body: bytes, *, sha256: str, content_type: str
    ) -> PutResult:
        """Create ``key`` holding ``body`` (bytes) unless it exists; never overwrite.

        ``content_type`` is accepted for interface parity and not stored.

        :raises ValueError: ``sha256`` is not the SHA-256 of ``body``, or the key is invalid.
        :raises ConflictError: the key exists with other bytes (or is not a regular file).
        :raises FatalError: permissions, read-only filesystem, no hard-link support.
        :raises DiskFullError: (exit 1) the output's filesystem is full.
        Rule source: POSIX ``link(2)`` fails with EEXIST if the new path exists.
        """
        _require_digest(body, sha256)
        target = self._path(key)
        try:
            created = self._create(target, body)
        except OSError as exc:
            translated = _translate_os_error(exc, str(target))
            if translated is None:
                raise
            raise translated from exc
        if created:
            logger.info("local PUT %s: created", target)
            return PutResult(created=True, sha256=sha256)
        return self._existing_result(key, target, sha256)

    def _create(self, target: Path, body: bytes) -> bool:
        """Write ``body`` to ``target`` via a linked temp file; False if ``target`` exists."""
        self._ensure_dir(target.parent)
        tmp = self._write_temp(target, body)
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        finally:
            _unlink_quietly(tmp)
        _fsync_dir(target.parent)
        return True

    def _ensure_dir(self, directory: Path) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry's parent."""
        missing: list[Path] = []
        current = directory
        while not current.is_dir():
            missing.append(current)
            current = current.parent
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            _fsync_dir(path.parent)

    @staticmethod
    def _write_temp(target: Path, body: bytes) -> Path:
        name = f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}"
        tmp = target.with_name(name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o644)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp

    def _existing_result(self, key: str, target: Path, sha256: str) -> PutResult:
        if not target.is_file():
            raise ConflictError(f"{self.uri_for(key)} exists and is not a regular file; "
                                "it is never replaced")
        existing = _hash_file(target)
        if existing != sha256:
            raise ConflictError(
                f"{self.uri_for(key)} already holds other bytes (sha256 {existing}, ours "
                f"{sha256}); it is never overwritten: use a fresh --output or remove it yourself"
            )
        logger.info("local PUT %s: exists with identical bytes", target)
        return PutResult(created=False, sha256=sha256)

    def head_sha256(self, key: str) -> str | None:
        """Return the SHA-256 (hex) of the file at ``key``, or None if there is none."""
        try:
            return _hash_file(self._path(key))
        except FileNotFoundError:
            return None

    def get(self, key: str) -> bytes:
        """Return the bytes at ``key``. :raises FileNotFoundError: if the key does not exist."""
        return self._path(key).read_bytes()

    def open_read(self, key: str) -> BinaryIO:
        """Return a seekable binary file over ``key`` (read only the parts you need).

        :raises FileNotFoundError: if the key does not exist.
        """
        return open(self._path(key), "rb")  # noqa: SIM115 — the caller closes it

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Yield the objects whose key starts with ``prefix`` (a folder such as ``chunks/``),
        temp files excluded, in no particular order."""
        top = self.root.joinpath(*[p for p in prefix.split("/") if p])
        for dirpath, _dirnames, filenames in os.walk(top):
            for name in filenames:
                if _TEMP_RE.match(name):
                    continue
                path = Path(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    stat = path.stat()
                    key = path.relative_to(self.root).as_posix()
                    yield ObjectInfo(key, stat.st_size, stat.st_mtime)

    def delete(self, key: str) -> None:
        """Delete ``key`` (garbage collection only; a missing key is not an error)."""
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        _fsync_dir(path.parent)

    def discard_scratch(self, key: str) -> None:
        """Delete a scratch key under ``_embedline/`` (best effort); other keys: ValueError."""
        if not _check_key(key).startswith(SCRATCH_PREFIX):
            raise ValueError(f"refusing to delete {key!r}: only {SCRATCH_PREFIX} keys")
        try:
            _unlink_quietly(self._path(key))
        except OSError as exc:
            logger.warning("could not delete scratch file %s: %s", self._path(key), exc.strerror)

    def sweep_temp_files(
        self, max_age_s: float = 3600.0, *, now: float | None = None
    ) -> list[str]:
        """Remove temp files left by dead writers; return their paths.

        Searches ``chunks/``, ``manifests/`` and ``_embedline/`` (recursively). Only names
        matching ``.{name}.tmp-{pid}-{16 hex}`` are touched: those whose writer process
        (``pid``, on this host) no longer exists, and any older than ``max_age_s`` seconds
        (a writer on another host sharing the directory). A younger temp file of a live
        process belongs to a writer still running, so it is left alone.
        """
        cutoff = (time.time() if now is None else now) - max_age_s
        removed: list[str] = []
        for top in ("chunks", "manifests", SCRATCH_PREFIX.rstrip("/")):
            for path in self._temp_files(self.root / top):
                with contextlib.suppress(FileNotFoundError):
                    if _writer_is_dead(path.name) or path.stat().st_mtime < cutoff:
                        os.unlink(path)
                        removed.append(str(path))
        return removed

    @staticmethod
    def _temp_files(top: Path) -> Iterator[Path]:
        for dirpath, _dirnames, filenames in os.walk(top):
            for name in filenames:
                if _TEMP_RE.match(name):
                    yield Path(dirpath, name)


# --------------------------------------------------------------------------- S3

#: Error codes that mean "credentials or permissions are wrong" (HTTP 403 family).
_AUTH_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "AccountProblem", "ExpiredToken",
    "InvalidAccessKeyId", "InvalidToken", "SignatureDoesNotMatch", "TokenRefreshRequired",
})
#: Error codes that mean "the request may succeed if sent again".
_TRANSIENT_CODES = frozenset({
    "BadDigest", "InternalError", "OperationAborted", "RequestTimeout",
    "ServiceUnavailable", "SlowDown", "XAmzContentSHA256Mismatch",
})


def _error_code_and_status(exc: Any) -> tuple[str, int | None]:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status


def _is_precondition_failed(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return False
    code, status = _error_code_and_status(exc)
    return code == "PreconditionFailed" or status == 412


def _is_not_found(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return False
    code, status = _error_code_and_status(exc)
    if code == "NoSuchBucket":  # GET names it; HEAD cannot (bare 404), see head_sha256
        return False
    return code in ("NoSuchKey", "404", "NotFound") or status == 404


def translate_s3_error(exc: BaseException, *, bucket: str, what: str) -> EmbedlineError | None:
    """Map a botocore exception to a failure class (DESIGN §5), most specific first.

    ``what`` names the operation and URI for the message (``"PUT s3://b/k"``); messages name
    the bucket and what to fix, never credentials. Returns None for an exception this
    function does not know: the caller re-raises it unchanged (an unknown error is a bug to
    see, not something to retry). 412 is not mapped here: ``put_if_absent`` handles it.

    - 409 ``ConditionalRequestConflict`` → ``RetryableError`` (AWS S3 user guide,
      "conditional writes": retry the request).
    - ``NoSuchBucket`` → ``FatalError``; 403 and credential codes → ``FatalError``.
    - ``NotImplemented`` / 501 → ``FatalError`` (the store lacks conditional writes).
    - 408, 429, 5xx and transient codes, connection errors and timeouts → ``RetryableError``
      (seen only after botocore's own retries gave up).
    - missing credentials → ``FatalError``; other 4xx → ``FatalError``.
    """
    from botocore import exceptions as bexc

    if isinstance(exc, bexc.ClientError):
        return _translate_client_error(exc, bucket=bucket, what=what)
    if isinstance(exc, (bexc.NoCredentialsError, bexc.PartialCredentialsError)):
        return FatalError(f"{what}: no usable AWS credentials for bucket {bucket!r}; set "
                          "AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or attach "
                          "a role")
    if isinstance(exc, (bexc.ConnectionError, bexc.HTTPClientError)):
        return RetryableError(f"{what}: connection failed or timed out "
                              f"({type(exc).__name__}); the store may be unreachable")
    return None


def _translate_client_error(exc: Any, *, bucket: str, what: str) -> EmbedlineError | None:
    code, status = _error_code_and_status(exc)
    label = f"{what}: {code or status}"
    if code == "ConditionalRequestConflict" or status == 409:
        return RetryableError(f"{label}: a concurrent write to the key is in progress",
                              http_status=409)
    if code == "NoSuchBucket":
        return FatalError(f"{label}: bucket {bucket!r} does not exist; create it or fix "
                          "--output (and AWS_ENDPOINT_URL / region for S3-compatible stores)",
                          http_status=status)
    if code in _AUTH_CODES or status == 403:
        return FatalError(f"{label}: access to bucket {bucket!r} was refused; check the AWS "
                          "credentials in use (AWS_PROFILE, AWS_ACCESS_KEY_ID, role) and that "
                          "the bucket policy allows s3:PutObject, s3:GetObject",
                          http_status=status)
    if code == "NotImplemented" or status == 501:
        return FatalError(f"{label}: the store behind bucket {bucket!r} does not implement "
                          "conditional writes (PutObject If-None-Match: *); use AWS S3 or a "
                          "store that does", http_status=status)
    if code in _TRANSIENT_CODES or status in (408, 429) or (status or 0) >= 500:
        return RetryableError(f"{label}: the store is failing or throttling",
                              http_status=status)
    if status is not None and 400 <= status < 500:
        said = store_message(exc)
        hint = checksum_hint(said) or "check the request and the store's documentation"
        return FatalError(f"{label}: the store rejected the request for bucket {bucket!r}"
                          + (f" ({said})" if said else "") + f"; {hint}", http_status=status)
    return None


def _raise_translated(exc: BaseException, *, bucket: str, what: str) -> NoReturn:
    translated = translate_s3_error(exc, bucket=bucket, what=what)
    if translated is None:
        raise exc
    raise translated from exc


def supports_if_none_match(client: Any) -> bool:
    """Return True if the botocore S3 model of ``client`` has ``PutObject.IfNoneMatch``.

    The parameter arrived with botocore 1.35.2 / boto3 1.35.2 (2024-08-20, "Amazon Simple
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
            _check_key(self.prefix)
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
                    self._client = self._checked(_build_client(
                        connect_timeout_s=self.connect_timeout_s,
                        read_timeout_s=self.read_timeout_s,
                        max_attempts=self.max_attempts,
                        max_pool=self.max_pool_connections,
                    ))
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
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri_for(self, key: str) -> str:
        """Return ``s3://bucket/prefix/key``. :raises ValueError: bad key."""
        return f"s3://{self.bucket}/{self._key(key)}"

    def put_if_absent(
        self, key: str, body: bytes, *, sha256: str, content_type: str
    ) -> PutResult:
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
        _require_digest(body, sha256)
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

    def _put_once(self, key: str, body: bytes, sha256: str, content_type: str) -> PutResult:
        from botocore.exceptions import BotoCoreError, ClientError

        digest_b64 = base64.b64encode(bytes.fromhex(sha256)).decode("ascii")
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=body, ContentType=content_type,
                IfNoneMatch="*", Metadata={"sha256": sha256},
                **put_checksum_args(self.client, digest_b64),
            )
        except (ClientError, BotoCoreError) as exc:
            if _is_precondition_failed(exc):
                return self._existing_result(key, sha256)
            _raise_translated(exc, bucket=self.bucket, what=f"PUT {self.uri_for(key)}")
        logger.info("S3 PUT %s: created", self.uri_for(key))
        return PutResult(created=True, sha256=sha256)

    def _existing_result(self, key: str, sha256: str) -> PutResult:
        stored = self.head_sha256(key)
        if stored is None:
            raise RetryableError(f"PUT {self.uri_for(key)}: 412 but the object is gone; retry",
                                 http_status=412)
        if stored != sha256:
            raise ConflictError(
                f"{self.uri_for(key)} already holds other bytes (sha256 {stored}, ours "
                f"{sha256}); it is never overwritten: use a fresh --output prefix",
                http_status=412,
            )
        logger.info("S3 PUT %s: exists with identical bytes (412)", self.uri_for(key))
        return PutResult(created=False, sha256=sha256)

    def head_sha256(self, key: str) -> str | None:
        """Return the object's ``sha256`` metadata (hex), or None on 404.

        A HEAD response has no body, so a missing bucket also reads as 404 → None here; the
        following ``put_if_absent`` then raises ``FatalError`` naming the bucket.

        :raises ConflictError: the object exists but carries no ``sha256`` metadata (it was
            not written by embedline, and is never replaced).
        :raises RetryableError, FatalError: as ``put_if_absent``.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            if _is_not_found(exc):
                return None
            _raise_translated(exc, bucket=self.bucket, what=f"HEAD {self.uri_for(key)}")
        stored = head.get("Metadata", {}).get("sha256")
        if not stored:
            raise ConflictError(f"{self.uri_for(key)} exists without sha256 metadata (not "
                                "written by embedline); it is never overwritten")
        return str(stored)

    def get(self, key: str) -> bytes:
        """Return the object's bytes. :raises FileNotFoundError: if the key does not exist."""
        from botocore.exceptions import BotoCoreError, ClientError

        what = f"GET {self.uri_for(key)}"
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return bytes(response["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            if _is_not_found(exc):
                raise FileNotFoundError(errno.ENOENT, "no such object", self.uri_for(key)) \
                    from exc
            _raise_translated(exc, bucket=self.bucket, what=what)

    def open_read(self, key: str) -> BinaryIO:
        """Return a seekable binary file over ``key`` that reads by HTTP ranges, so a Parquet
        reader fetches only the footer and the columns it needs.

        The first request asks for the object's last ``_TAIL_BYTES`` (a suffix range, RFC
        9110 §14.1.1): its ``Content-Range`` gives the size and it holds the Parquet footer.
        Later ranges are pinned to the first answer's ETag (``If-Match``).

        :raises FileNotFoundError: if the key does not exist.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                              Range=f"bytes=-{_TAIL_BYTES}")  # fmt: skip
            tail = bytes(response["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            if _is_not_found(exc):
                raise FileNotFoundError(errno.ENOENT, "no such object", self.uri_for(key)) \
                    from exc
            _raise_translated(exc, bucket=self.bucket, what=f"GET {self.uri_for(key)}")
        content_range = str(response.get("ContentRange") or "")
        size = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else len(tail)
        raw = _S3RangeReader(self, key, size, response.get("ETag"), tail)
        return io.BufferedReader(raw, buffer_size=1 << 16)

    def _get_range(self, key: str, start: int, stop: int, etag: str | None) -> bytes:
        """Bytes ``[start, stop)`` of ``key``; ``etag`` pins the version that was opened."""
        from botocore.exceptions import BotoCoreError, ClientError

        extra = {"IfMatch": etag} if etag else {}
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                              Range=f"bytes={start}-{stop - 1}", **extra)
            return bytes(response["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            if _is_not_found(exc):
                raise FileNotFoundError(errno.ENOENT, "no such object", self.uri_for(key)) \
                    from exc
            _raise_translated(exc, bucket=self.bucket, what=f"GET {self.uri_for(key)}")

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Yield the objects whose key starts with ``prefix`` (``ListObjectsV2``, paginated)."""
        from botocore.exceptions import BotoCoreError, ClientError

        root = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    yield ObjectInfo(item["Key"][len(root):], int(item["Size"]),
                                     item["LastModified"].timestamp())
        except (ClientError, BotoCoreError) as exc:
            _raise_translated(exc, bucket=self.bucket, what=f"LIST {self.uri_for(prefix)}")

    def delete(self, key: str) -> None:
        """Delete ``key`` (garbage collection only; a missing key is not an error)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            _raise_translated(exc, bucket=self.bucket, what=f"DELETE {self.uri_for(key)}")

    def discard_scratch(self, key: str) -> None:
        """Delete a scratch key under ``_embedline/`` (best effort); other keys: ValueError.

        Chunk and manifest objects are never deleted; this exists for the conditional-write
        probe's own scratch object only.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        if not _check_key(key).startswith(SCRATCH_PREFIX):
            raise ValueError(f"refusing to delete {key!r}: only {SCRATCH_PREFIX} keys")
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            logger.warning("could not delete scratch object %s: %s", self.uri_for(key),
                           type(exc).__name__)


class _S3RangeReader(io.RawIOBase):
    """A read-only, seekable raw file over one S3 object, one ranged GET per ``readinto``."""

    def __init__(
        self, store: S3Store, key: str, size: int, etag: str | None, tail: bytes
    ) -> None:
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
            data = self._tail[self._pos - self._tail_start: stop - self._tail_start]
        else:
            data = self._store._get_range(self._key, self._pos, stop, self._etag)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _is_conditional_conflict(exc: BaseException) -> bool:
    return isinstance(exc, RetryableError) and exc.http_status == 409


def _log_conflict_retry(retry_state: Any) -> None:
    seconds = retry_state.next_action.sleep if retry_state.next_action else 0.0
    logger.warning("S3 409 ConditionalRequestConflict; retrying in %.2f s (attempt %d)",
                   seconds, retry_state.attempt_number)


# --------------------------------------------------------------------------- probes and URIs


def check_conditional_writes(store: ObjectStore) -> bool:
    """Return True if ``store`` refuses to overwrite an existing key, False if it overwrote.

    Creates ``_embedline/conditional-write-check/{random}`` with one body, then tries to
    create it again with another: a store honouring ``If-None-Match: *`` answers 412 (→
    ``ConflictError`` → True); one that ignores the header replaces the object (→ False).
    The scratch object is then deleted, best effort (only ``_embedline/`` keys ever are).

    :raises FatalError: the store refuses the write itself (bucket, credentials).
    :raises RetryableError: the store is unreachable or failing.
    """
    key = f"{SCRATCH_PREFIX}conditional-write-check/{secrets.token_hex(16)}"
    first = b"embedline conditional write check: 1\n"
    second = b"embedline conditional write check: 2\n"
    store.put_if_absent(key, first, sha256=_sha256_hex(first), content_type="text/plain")
    try:
        store.put_if_absent(key, second, sha256=_sha256_hex(second), content_type="text/plain")
    except ConflictError:
        refused = True
    else:
        refused = False
        logger.warning("%s overwrote an existing object: it ignores If-None-Match",
                       store.uri_for(key))
    discard = getattr(store, "discard_scratch", None)
    if discard is not None:
        discard(key)
    return refused


_redact = redact


def open_store(uri: str) -> ObjectStore:
    """Return the store for ``--output``: ``s3://bucket[/prefix]`` → ``S3Store``;
    ``file:///abs/path`` or a plain path → ``LocalDirStore``. Opens no connection.

    The prefix and a plain path are kept exactly as written (``adapters.uris``: ``#``, ``?``,
    ``%``, ``+``, spaces are part of the name); a ``file://`` path is percent-decoded.

    :raises InputError: empty URI, ``s3://`` without a valid bucket, credentials in the URI,
        a bad prefix, a ``file://`` URI that is not absolute, any other scheme.
    """
    found = split_location(uri, what="--output", forms=_ACCEPTED_FORMS)
    if found.kind == "local":
        return LocalDirStore(found.path)
    try:
        return S3Store(found.bucket, found.key)
    except ValueError as exc:
        raise InputError(f"--output {_redact(uri.strip())}: {exc}; {_ACCEPTED_FORMS}") from None
