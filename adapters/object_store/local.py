"""The local directory store: create-only writes by ``link(2)`` (docs/reference/output-layout.md).

A write is a temp file in the target's directory, fsynced, then ``os.link``-ed to the target
name (``link(2)`` fails with EEXIST if the name exists), then the directory is fsynced.
Filesystem errors are translated here (``_translate_os_error``) and nowhere else.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from adapters.disk_full import full_error, is_disk_full
from adapters.object_store.common import (
    SCRATCH_PREFIX,
    check_key,
    check_scratch_key,
    copy_hashing,
    require_digest,
    sha256_file,
)
from adapters.object_store.conditional import existing_result
from adapters.processes import local_process_is_gone
from embedline.errors import ConflictError, EmbedlineError, FatalError, InputError
from embedline.protocols import ObjectInfo, PutResult

__all__ = ["LocalDirStore"]

logger = logging.getLogger("embedline")

#: Temp files are named ``.{name}.tmp-{pid}-{16 hex}`` so ``sweep_temp_files`` can find them.
_TEMP_RE = re.compile(r"^\..+\.tmp-(?P<pid>\d+)-[0-9a-f]{16}$")


def _translate_os_error(exc: OSError, path: str) -> EmbedlineError | None:
    """Map a filesystem error to a failure class; None means "unknown, re-raise as is"."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return FatalError(
            f"cannot write {path}: {exc.strerror}; check the output directory's "
            "permissions and that its filesystem is writable"
        )
    if is_disk_full(exc):  # exit 1: a rerun after freeing space resumes (adapters.disk_full)
        return full_error(path, "output")
    if exc.errno in (errno.ENOTDIR, errno.EISDIR):
        return FatalError(
            f"cannot write {path}: {exc.strerror}; a file stands where the "
            "output layout needs a directory (or the reverse)"
        )
    if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
        return FatalError(
            f"cannot create {path}: {exc.strerror}; the output filesystem does "
            "not support hard links, which create-only writes need"
        )
    return None


@contextlib.contextmanager
def _in_the_way_is_a_conflict(path: Path) -> Iterator[None]:
    """Around a read or existence check of ``path``: a directory where an object should
    be, or a file where one of its directories should be, is a ``ConflictError`` (never
    replaced), not an ``IsADirectoryError`` traceback."""
    try:
        yield
    except (IsADirectoryError, NotADirectoryError):
        raise ConflictError(
            f"{path} (or a directory above it) exists and is not what the "
            "output layout needs; it is never replaced: remove it yourself "
            "or use a fresh --output"
        ) from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


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
            raise InputError(
                f"--output {self.uri} exists and is not a directory; choose a directory path"
            )
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(
                f"--output {self.uri} cannot be created: {exc.strerror}; "
                "choose a writable directory"
            ) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise InputError(f"--output {self.uri} is not writable; choose a writable directory")

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def uri_for(self, key: str) -> str:
        """Return the absolute path of ``key`` as a string. :raises ValueError: bad key."""
        return str(self._path(key))

    def put_if_absent(self, key: str, body: bytes, *, sha256: str, content_type: str) -> PutResult:
        """Create ``key`` holding ``body`` (bytes) unless it exists; never overwrite.

        ``content_type`` is accepted for interface parity and not stored.

        :raises ValueError: ``sha256`` is not the SHA-256 of ``body``, or the key is invalid.
        :raises ConflictError: the key exists with other bytes (or is not a regular file).
        :raises FatalError: permissions, read-only filesystem, no hard-link support.
        :raises DiskFullError: (exit 1) the output's filesystem is full.
        Rule source: POSIX ``link(2)`` fails with EEXIST if the new path exists.
        """
        require_digest(body, sha256)

        def fill(fh: BinaryIO) -> str:
            fh.write(body)
            return sha256

        return self._put(key, fill)

    def put_file_if_absent(
        self, key: str, path: str | os.PathLike[str], *, content_type: str
    ) -> PutResult:
        """Create ``key`` holding the bytes of the local file ``path`` unless it exists;
        never overwrite. The file is copied (and hashed) a MiB at a time into a temp file
        beside the target, then linked into place as ``put_if_absent`` does.

        :raises FileNotFoundError: ``path`` does not exist.
        Other errors: as ``put_if_absent``.
        """
        with open(path, "rb") as source:  # opened here: its errors are not the output's
            return self._put(key, lambda fh: copy_hashing(source, fh.write))

    def _put(self, key: str, fill: Callable[[BinaryIO], str]) -> PutResult:
        """Create ``key`` from a temp file that ``fill`` writes, returning the SHA-256 (hex)
        of what it wrote."""
        target = self._path(key)
        try:
            created, sha256 = self._create(target, fill)
        except OSError as exc:
            translated = _translate_os_error(exc, str(target))
            if translated is None:
                raise
            raise translated from exc
        if created:
            logger.info("local PUT %s: created", target)
            return PutResult(created=True, sha256=sha256)
        return self._existing_result(key, target, sha256)

    def _create(self, target: Path, fill: Callable[[BinaryIO], str]) -> tuple[bool, str]:
        """Write the body (``fill``) to ``target`` via a linked temp file; return whether
        it was created (False: ``target`` exists) and the body's SHA-256."""
        self._ensure_dir(target.parent)
        tmp, sha256 = self._write_temp(target, fill)
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False, sha256
        finally:
            _unlink_quietly(tmp)
        _fsync_dir(target.parent)
        return True, sha256

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
    def _write_temp(target: Path, fill: Callable[[BinaryIO], str]) -> tuple[Path, str]:
        name = f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}"
        tmp = target.with_name(name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            with os.fdopen(fd, "wb") as fh:
                sha256 = fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp, sha256

    def _existing_result(self, key: str, target: Path, sha256: str) -> PutResult:
        if not target.is_file():
            raise ConflictError(
                f"{self.uri_for(key)} exists and is not a regular file; it is never replaced"
            )
        result = existing_result(
            self.uri_for(key),
            sha256_file(target),
            sha256,
            fix="use a fresh --output or remove it yourself",
        )
        logger.info("local PUT %s: exists with identical bytes", target)
        return result

    def head_sha256(self, key: str) -> str | None:
        """Return the SHA-256 (hex) of the file at ``key``, or None if there is none.

        :raises ConflictError: something that is not a regular file stands at ``key``, or a
            file stands where one of its directories should be (it is never replaced).
        """
        path = self._path(key)
        try:
            with _in_the_way_is_a_conflict(path):
                return sha256_file(path)
        except FileNotFoundError:
            return None

    def get(self, key: str) -> bytes:
        """Return the bytes at ``key``.

        :raises FileNotFoundError: if the key does not exist.
        :raises ConflictError: as ``head_sha256``.
        """
        path = self._path(key)
        with _in_the_way_is_a_conflict(path):
            return path.read_bytes()

    def open_read(self, key: str) -> BinaryIO:
        """Return a seekable binary file over ``key`` (read only the parts you need).

        :raises FileNotFoundError: if the key does not exist.
        :raises ConflictError: as ``head_sha256``.
        """
        path = self._path(key)
        with _in_the_way_is_a_conflict(path):
            return open(path, "rb")  # the caller closes it

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

    def server_now(self) -> float:
        """The filesystem's clock now: the mtime of a probe temp file created (and removed)
        under ``_embedline/``, or the root when that does not exist. A file server (NFS)
        sets mtimes by its own clock, the clock ``list`` reports. When no probe can be
        written (a read-only output), this host's clock, with a warning; for a root that does
        not exist, this host's clock (it holds nothing whose age matters).
        """
        if not self.root.is_dir():  # nothing stored here (a mistyped path): no ages to judge
            return time.time()
        scratch = self.root / SCRATCH_PREFIX.rstrip("/")
        where = scratch if scratch.is_dir() else self.root
        probe = where / f".clock.tmp-{os.getpid()}-{secrets.token_hex(8)}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            logger.warning(
                "cannot read the clock of %s (%s): judging ages by this host's clock",
                self.root,
                exc.strerror,
            )
            return time.time()
        try:
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)
            _unlink_quietly(probe)

    def delete(self, key: str) -> None:
        """Delete ``key`` (garbage collection only; a missing key is not an error)."""
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        _fsync_dir(path.parent)

    def discard_scratch(self, key: str) -> None:
        """Delete a scratch key under ``_embedline/`` (best effort); other keys: ValueError."""
        check_scratch_key(key)
        try:
            _unlink_quietly(self._path(key))
        except OSError as exc:
            logger.warning("could not delete scratch file %s: %s", self._path(key), exc.strerror)

    def sweep_temp_files(
        self, max_age_s: float = 3600.0, *, now: float | None = None
    ) -> builtins.list[str]:
        """Remove temp files left by dead writers; return their paths.

        Searches ``chunks/``, ``changes/``, ``manifests/`` and ``_embedline/``
        (recursively). Only names matching ``.{name}.tmp-{pid}-{16 hex}`` are touched:
        those whose writer process (``pid``, on this host) no longer exists, and any older
        than ``max_age_s`` seconds (a writer on another host sharing the directory). A
        younger temp file of a live process belongs to a writer still running, so it is
        left alone. Ages are judged by the filesystem's clock (``server_now``, the clock
        that stamped the files: a file server's on NFS), so a host whose clock runs ahead
        never takes a live writer's file for old; ``now`` (Unix s) overrides it.
        """
        candidates = [
            path
            for top in ("chunks", "changes", "manifests", SCRATCH_PREFIX.rstrip("/"))
            for path in self._temp_files(self.root / top)
        ]
        if not candidates:
            return []
        cutoff = (self.server_now() if now is None else now) - max_age_s
        removed: list[str] = []
        for path in candidates:
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
