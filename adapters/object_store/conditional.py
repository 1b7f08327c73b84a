"""Create-only publishing, the part both stores share (docs/reference/output-layout.md).

A create that finds its key taken (``EEXIST`` from ``link(2)``, S3's 412 Precondition
Failed) is resolved by content: the same SHA-256 → already published (``created=False``);
other bytes → ``ConflictError``, and the object is never overwritten or deleted.
``check_conditional_writes`` asks a store whether it keeps that promise at all.
"""

from __future__ import annotations

import logging
import secrets

from adapters.object_store.common import SCRATCH_PREFIX, sha256_hex
from embedline.errors import ConflictError
from embedline.protocols import ObjectStore, PutResult

__all__ = ["check_conditional_writes", "existing_result"]

logger = logging.getLogger("embedline")


def existing_result(
    uri: str, stored: str, sha256: str, *, fix: str, http_status: int | None = None
) -> PutResult:
    """Resolve a create that found ``uri`` taken, holding bytes of SHA-256 ``stored`` (hex).

    :returns: ``PutResult(created=False)`` if ``stored`` equals ``sha256`` (ours).
    :raises ConflictError: the key holds other bytes; ``fix`` ends the message (what the
        user can do), ``http_status`` is kept on the error (412 on S3).
    """
    if stored != sha256:
        raise ConflictError(
            f"{uri} already holds other bytes (sha256 {stored}, ours {sha256}); it is never "
            f"overwritten: {fix}",
            http_status=http_status,
        )
    return PutResult(created=False, sha256=sha256)


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
    store.put_if_absent(key, first, sha256=sha256_hex(first), content_type="text/plain")
    try:
        store.put_if_absent(key, second, sha256=sha256_hex(second), content_type="text/plain")
    except ConflictError:
        refused = True
    else:
        refused = False
        # DEBUG: the caller says it once, in the one line the user reads
        # (tasks/publish/chunk_object.py)
        logger.debug(
            "%s overwrote an existing object: it ignores If-None-Match", store.uri_for(key)
        )
    store.discard_scratch(key)
    return refused
