"""Object stores with create-only writes: a local directory and S3
(docs/reference/output-layout.md).

Both stores give the same contract (``embedline.protocols.ObjectStore``): ``put_if_absent``
creates a key or finds it already holding the same bytes (SHA-256 equal → ``created=False``);
a key holding other bytes raises ``ConflictError`` and is never overwritten or deleted.

- ``local``: ``LocalDirStore``, temp file in the target's directory, fsync, ``os.link`` into
  place (``link(2)`` fails with EEXIST if the name exists), fsync the directory.
- ``s3``: ``S3Store``, ``PutObject`` with ``If-None-Match: *`` (412 when the key exists, 409
  to retry); ``s3_errors`` translates botocore's errors, at one point.
- ``conditional``: what both share when a key is taken, and ``check_conditional_writes``.
- ``common``: key rules, digests, the scratch prefix.

Third-party errors are translated in ``s3_errors`` and ``local`` and nowhere else; adapters
never import prefect. ``open_store`` (here) picks the store for an ``--output`` URI.
"""

from __future__ import annotations

from adapters.object_store.common import SCRATCH_PREFIX
from adapters.object_store.conditional import check_conditional_writes
from adapters.object_store.local import LocalDirStore
from adapters.object_store.s3 import S3Store, supports_if_none_match
from adapters.object_store.s3_errors import translate_s3_error
from adapters.uris import redact, split_location
from embedline.errors import InputError
from embedline.protocols import ObjectStore

__all__ = [
    "SCRATCH_PREFIX",
    "LocalDirStore",
    "S3Store",
    "check_conditional_writes",
    "open_store",
    "supports_if_none_match",
    "translate_s3_error",
]

_ACCEPTED_FORMS = (
    "accepted forms: s3://bucket or s3://bucket/prefix, file:///absolute/path, "
    "or a plain directory path"
)


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
        raise InputError(f"--output {redact(uri.strip())}: {exc}; {_ACCEPTED_FORMS}") from None
