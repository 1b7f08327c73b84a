"""S3 errors, translated at one point (docs/reference/failure-classes.md), like httpx's
``map_httpcore_exceptions``.

Every ``S3Store`` call to botocore runs inside ``s3_errors(...)``: botocore's ``ClientError``
and ``BotoCoreError`` become embedline's failure classes there and nowhere else. The two
answers a caller resolves itself are raised as plain signals instead: ``KeyExists`` (412 on
a create, only where ``exists=True``) and ``FileNotFoundError`` (404 on a read, only where
``missing=`` names the object).
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator
from typing import Any

from adapters.s3_checksums import checksum_hint, store_message
from embedline.errors import EmbedlineError, FatalError, RetryableError

__all__ = ["KeyExists", "s3_errors", "translate_s3_error"]

logger = logging.getLogger("embedline")


class KeyExists(Exception):
    """Raised by ``s3_errors(exists=True)`` when a create-only PUT answered 412: the key exists."""


#: Error codes that mean "credentials or permissions are wrong" (HTTP 403 family).
_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
    }
)
#: Error codes that mean "the request may succeed if sent again".
_TRANSIENT_CODES = frozenset(
    {
        "BadDigest",
        "InternalError",
        "OperationAborted",
        "RequestTimeout",
        "ServiceUnavailable",
        "SlowDown",
        "XAmzContentSHA256Mismatch",
    }
)


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
    """Map a botocore exception to a failure class (docs/reference/failure-classes.md), most
    specific first.

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
        return FatalError(
            f"{what}: no usable AWS credentials for bucket {bucket!r}; set "
            "AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or attach "
            "a role"
        )
    if isinstance(exc, (bexc.ConnectionError, bexc.HTTPClientError)):
        return RetryableError(
            f"{what}: connection failed or timed out "
            f"({type(exc).__name__}); the store may be unreachable"
        )
    return None


def _translate_client_error(exc: Any, *, bucket: str, what: str) -> EmbedlineError | None:
    code, status = _error_code_and_status(exc)
    label = f"{what}: {code or status}"
    if code == "ConditionalRequestConflict" or status == 409:
        return RetryableError(
            f"{label}: a concurrent write to the key is in progress", http_status=409
        )
    if code == "NoSuchBucket":
        return FatalError(
            f"{label}: bucket {bucket!r} does not exist; create it or fix "
            "--output (and AWS_ENDPOINT_URL / region for S3-compatible stores)",
            http_status=status,
        )
    if code in _AUTH_CODES or status == 403:
        return FatalError(
            f"{label}: access to bucket {bucket!r} was refused; check the AWS "
            "credentials in use (AWS_PROFILE, AWS_ACCESS_KEY_ID, role) and that "
            "the bucket policy allows s3:PutObject, s3:GetObject",
            http_status=status,
        )
    if code == "NotImplemented" or status == 501:
        return FatalError(
            f"{label}: the store behind bucket {bucket!r} does not implement "
            "conditional writes (PutObject If-None-Match: *); use AWS S3 or a "
            "store that does",
            http_status=status,
        )
    if code in _TRANSIENT_CODES or status in (408, 429) or (status or 0) >= 500:
        return RetryableError(f"{label}: the store is failing or throttling", http_status=status)
    if status is not None and 400 <= status < 500:
        said = store_message(exc)
        hint = checksum_hint(said) or "check the request and the store's documentation"
        return FatalError(
            f"{label}: the store rejected the request for bucket {bucket!r}"
            + (f" ({said})" if said else "")
            + f"; {hint}",
            http_status=status,
        )
    return None


@contextlib.contextmanager
def s3_errors(
    *,
    bucket: str,
    what: str,
    missing: str | None = None,
    exists: bool = False,
    warning: str | None = None,
) -> Iterator[None]:
    """Translate the botocore errors raised inside the block (``translate_s3_error``).

    :param what: the operation and URI for messages (``"GET s3://b/k"``).
    :param missing: the object's URI: a 404 raises ``FileNotFoundError`` naming it.
    :param exists: a 412 raises ``KeyExists`` (a create-only PUT found the key taken).
    :param warning: best effort: log any botocore error with this %-format (args ``what``
        and the error's class name) as a warning, and go on (deleting scratch objects).
    :raises EmbedlineError: the translated failure, ``from`` the botocore exception; an
        exception ``translate_s3_error`` does not know is re-raised unchanged.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        if warning is not None:
            logger.warning(warning, what, type(exc).__name__)
            return
        if exists and _is_precondition_failed(exc):
            raise KeyExists(what) from exc
        if missing is not None and _is_not_found(exc):
            raise FileNotFoundError(errno.ENOENT, "no such object", missing) from exc
        translated = translate_s3_error(exc, bucket=bucket, what=what)
        if translated is None:
            raise
        raise translated from exc
