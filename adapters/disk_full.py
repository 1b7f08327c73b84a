"""A full filesystem, met by any write embedline makes: one error, one line, exit 1.

Every adapter that writes (the SQLite ledger, scratch files, the local output store, the
LanceDB sink directory) translates "no space left" at one point with ``translate_full``
(the ledger: every statement through ``LedgerConnection``) into ``DiskFullError``, whose
message names the path and the filesystem to free space on. A rerun after freeing space
resumes: nothing published is lost (objects are published before the ledger records them,
and a rerun finds them in the store) or paid again.

What counts as full (``is_disk_full``):

* ``OSError`` with errno ``ENOSPC`` or ``EDQUOT`` (POSIX ``write(2)``), also as the cause
  or context of another exception;
* ``sqlite3.Error`` with ``sqlite_errorcode`` ``SQLITE_FULL`` (13, "database or disk is
  full": https://www.sqlite.org/rescode.html#full), raised by a write, a migration, or the
  WAL checkpoint at commit or close; and SQLite's ``SQLITE_IOERR``/``SQLITE_CANTOPEN`` when
  the file's filesystem has no free block left (SQLite reports some short writes of its
  journal, WAL or shm file that way);
* an error whose text is the OS's "No space left on device" / "os error 28" (LanceDB's Rust
  I/O errors, pyarrow's ``OSError`` without an errno).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
from collections.abc import Iterator
from typing import Any

from embedline.errors import DiskFullError

__all__ = ["LedgerConnection", "full_error", "is_disk_full", "translate_full"]

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("no space left on device", "(os error 28)", "disk quota exceeded", "(os error 122)")
_SQLITE_FULL = 13  # https://www.sqlite.org/rescode.html#full
_SQLITE_MAYBE_FULL = (10, 14)  # SQLITE_IOERR, SQLITE_CANTOPEN: full only if no space is left
_NEARLY_NO_SPACE = 64 << 10  # bytes free below which an I/O error is taken as "full"


def is_disk_full(exc: BaseException, path: str | None = None) -> bool:
    """True if ``exc`` (or an exception it was raised from) says the filesystem is full.

    ``path``: the file written, to tell SQLite's I/O errors on a full filesystem from
    others (by its filesystem's free bytes, ``shutil.disk_usage``).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if isinstance(current, sqlite3.Error):
            code = getattr(current, "sqlite_errorcode", None)
            if code is not None and code & 0xFF == _SQLITE_FULL:
                return True
            if code is not None and code & 0xFF in _SQLITE_MAYBE_FULL and path:
                return _free_bytes(path) < _NEARLY_NO_SPACE
        if any(text in str(current).lower() for text in _FULL_TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False


def _free_bytes(path: str) -> int:
    try:
        return shutil.disk_usage(_existing_parent(path)).free
    except OSError:
        return 1 << 62


def _existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _mount_point(path: str) -> str:
    path = _existing_parent(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def full_error(path: str, what: str) -> DiskFullError:
    """The one-line error for ``what`` (e.g. "ledger") at ``path`` on a full filesystem."""
    path = os.path.abspath(path)
    return DiskFullError(
        f"the filesystem of the {what} {path} is full: free space on "
        f"{_mount_point(path)} and rerun the same command",
        path=path,
    )


@contextlib.contextmanager
def translate_full(path: str, what: str) -> Iterator[None]:
    """Raise ``full_error(path, what)`` (``from None``: one line) for a full-filesystem error
    inside the block; re-raise anything else unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        if is_disk_full(exc, path):
            raise full_error(path, what) from None
        raise


class LedgerConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` (``sqlite3.connect(..., factory=LedgerConnection)``) whose
    statements, commits and close raise ``DiskFullError`` naming the ledger when its
    filesystem is full: the ledger's one translation point. Set ``ledger_path`` after
    connecting."""

    ledger_path = ""

    def execute(self, *args: Any) -> sqlite3.Cursor:
        with translate_full(self.ledger_path, "ledger"):
            return super().execute(*args)

    def executemany(self, *args: Any) -> sqlite3.Cursor:
        with translate_full(self.ledger_path, "ledger"):
            return super().executemany(*args)

    def commit(self) -> None:
        with translate_full(self.ledger_path, "ledger"):
            super().commit()

    def close(self) -> None:
        with translate_full(self.ledger_path, "ledger"):
            super().close()
