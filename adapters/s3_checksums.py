"""Flexible checksums on S3 writes, following botocore's own setting.

botocore sends a flexible checksum (``x-amz-checksum-*``, ``x-amz-sdk-checksum-algorithm``)
on PutObject unless ``request_checksum_calculation`` is ``when_required`` — set by the
environment variable ``AWS_REQUEST_CHECKSUM_CALCULATION``, the AWS config file's
``request_checksum_calculation`` or ``botocore.config.Config`` (botocore/configprovider.py,
botocore/args.py ``_compute_checksum_config``). Under ``when_required`` botocore adds none
for PutObject (botocore/httpchecksum.py ``resolve_request_checksum_algorithm``: the default
applies only ``when_supported``), but an explicit ``ChecksumSHA256`` parameter is still sent
as a header. Some S3-compatible stores refuse those headers (Backblaze B2: 400
``Unsupported header 'x-amz-checksum-sha256'``), so embedline sends ``ChecksumSHA256`` only
when botocore would send a checksum anyway. The content stays verified either way by the
``sha256`` user metadata checked on every read (docs/reference/output-layout.md).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CHECKSUM_SETTING_HINT",
    "RESPONSE_SETTING_HINT",
    "checksum_hint",
    "put_checksum_args",
    "store_message",
]

#: Which setting to change, for messages (env var first: the one a CLI user can set).
CHECKSUM_SETTING_HINT = (
    "set AWS_REQUEST_CHECKSUM_CALCULATION=when_required (or request_checksum_calculation = "
    "when_required in the AWS config file) for a store without flexible checksums"
)

_MESSAGE_CHARS = 200  # the store's message is shown up to this many characters


def put_checksum_args(client: Any, sha256_b64: str) -> dict[str, str]:
    """PutObject keyword arguments for the body's checksum: ``{"ChecksumSHA256": b64}``
    unless the client's resolved ``request_checksum_calculation`` is ``when_required``,
    then ``{}`` (no flexible-checksum header at all)."""
    config = getattr(getattr(client, "meta", None), "config", None)
    if getattr(config, "request_checksum_calculation", None) == "when_required":
        return {}
    return {"ChecksumSHA256": sha256_b64}


def store_message(exc: Any) -> str:
    """The store's own error message of a botocore ``ClientError`` (one line, at most
    200 characters), or ``""``."""
    response = getattr(exc, "response", None) or {}
    text = " ".join(str(response.get("Error", {}).get("Message") or "").split())
    return text[:_MESSAGE_CHARS]


#: The same for ``x-amz-checksum-mode`` (botocore asks for response checksums on GetObject
#: unless ``response_checksum_validation`` is ``when_required``).
RESPONSE_SETTING_HINT = (
    "set AWS_RESPONSE_CHECKSUM_VALIDATION=when_required (or response_checksum_validation = "
    "when_required in the AWS config file) for a store without flexible checksums"
)


def checksum_hint(message: str) -> str:
    """The setting to change if the store's ``message`` refuses a checksum header
    (``CHECKSUM_SETTING_HINT``, or ``RESPONSE_SETTING_HINT`` for ``x-amz-checksum-mode``),
    else ``""``."""
    lowered = message.lower()
    if "x-amz-checksum-mode" in lowered:
        return RESPONSE_SETTING_HINT
    return CHECKSUM_SETTING_HINT if "checksum" in lowered else ""
