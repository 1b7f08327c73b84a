"""What both object stores share: key rules, the body's digest, the scratch prefix.

Imported by ``local``, ``s3`` and ``conditional``; it imports neither store.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import BinaryIO

__all__ = [
    "SCRATCH_PREFIX",
    "check_key",
    "check_scratch_key",
    "copy_hashing",
    "require_digest",
    "sha256_file",
    "sha256_hex",
]

_READ_BLOCK = 1 << 20  # bytes per read when streaming a file

#: Scratch keys (``check_conditional_writes``) live under this prefix; only they may be deleted.
SCRATCH_PREFIX = "_embedline/"


def sha256_hex(body: bytes) -> str:
    """Return the lowercase hex SHA-256 of ``body`` (64 characters)."""
    return hashlib.sha256(body).hexdigest()


def copy_hashing(source: BinaryIO, write: Callable[[bytes], object] | None = None) -> str:
    """Read ``source`` to its end a MiB at a time, passing each block to ``write`` (if
    given); return the lowercase hex SHA-256 of what was read."""
    digest = hashlib.sha256()
    for block in iter(lambda: source.read(_READ_BLOCK), b""):
        digest.update(block)
        if write is not None:
            write(block)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the lowercase hex SHA-256 of the file at ``path``, read a MiB at a time.

    :raises FileNotFoundError: there is no such file.
    """
    with open(path, "rb") as fh:
        return copy_hashing(fh)


def require_digest(body: bytes, sha256: str) -> None:
    """Raise ValueError unless ``sha256`` is the lowercase hex SHA-256 of ``body``.

    A mismatch is a programming error in the caller, not a store failure.
    """
    actual = sha256_hex(body)
    if sha256 != actual:
        raise ValueError(f"sha256 argument {sha256!r} does not match the body ({actual})")


def check_key(key: str) -> str:
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


def check_scratch_key(key: str) -> str:
    """Return ``key`` if it is a valid key under ``SCRATCH_PREFIX``; else ValueError.

    Chunk and manifest objects are never deleted by a run: only scratch keys are.
    """
    if not check_key(key).startswith(SCRATCH_PREFIX):
        raise ValueError(f"refusing to delete {key!r}: only {SCRATCH_PREFIX} keys")
    return key
