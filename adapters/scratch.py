"""Local scratch space: what would otherwise grow memory with the row count goes to disk.

A run's per-row state — 64-bit digests of every id for the duplicate check, every text's
hash with its chunk and position for reuse, the plan of which earlier object holds which
row's vector, the vectors gathered for each chunk — is written to files in a private
directory instead of Python containers, so the process's memory stays flat from 100,000
rows to tens of millions. Two shapes cover it:

- ``Spill``: fixed-size numpy records appended to one file per partition (a hash bucket,
  a chunk, a group of chunks), buffered in memory up to a bound and read back a partition
  at a time. Partitioning by the top bits of a uniform hash is what makes a "join" or a
  "unique" over N rows cost N log(N/P) with memory N/P.
- ``Scratch``: the directory itself, ``{root}/scratch/{token}/``, locked for its whole life
  (``fcntl.flock`` on a file inside it), deleted by ``close``, at process exit, and by the
  next ``Scratch.create`` under the same root if the process died without cleaning up (a
  lock nobody holds is a dead owner: the kernel drops it with the process, ``kill -9`` too).

The root is the ledger's directory (``.embedline/`` by default): a place the user chose for
embedline's local state, on a disk that holds the ledger, and not ``/tmp``, which may be a
small tmpfs. A full filesystem raises ``DiskFullError`` naming the scratch path (exit 1,
nothing published is lost).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.disk_full import translate_full
from embedline.exit_cleanups import exit_cleanup

__all__ = [
    "Scratch",
    "Spill",
    "digests",
    "hash_prefix",
    "hash_prefixes",
    "release",
    "stable_order",
    "sweep_dead",
]

_LOCK = ".lock"
_TOKEN = re.compile(r"[0-9a-f]{16}\Z")  # a scratch directory's name: secrets.token_hex(8)
_MAKING_S = 3600.0  # seconds after which a directory still being made is abandoned
_live: dict[Path, Scratch] = {}  # directories this process created and has not closed yet
_live_lock = threading.Lock()


def hash_prefix(text_sha256: str) -> int:
    """The first 8 bytes of a hex SHA-256 as an unsigned 64-bit int (big-endian, so the
    top bits, which ``Spill`` partitions by, are the hash's first hex digits)."""
    return int(text_sha256[:16], 16)


def hash_prefixes(hex_hashes: Any) -> np.ndarray:
    """``hash_prefix`` of a sequence (or Arrow string array) of hex SHA-256s: ``uint64``
    array of the same length."""
    return digests(hex_hashes)[:, :8].copy().view(">u8").ravel().astype(np.uint64)


def stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of non-negative integer ``keys``; as ``uint16``
    when they fit, which numpy sorts by radix in linear time (5x faster on 65,536
    partition numbers than the merge sort it uses for 64-bit ints)."""
    if len(keys) and keys.min() >= 0 and keys.max() < 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    return np.argsort(keys, kind="stable")


def digests(hex_hashes: Any) -> np.ndarray:
    """The raw SHA-256s of hex SHA-256s (a sequence of ``str`` or an Arrow string array):
    ``uint8`` array of shape ``(n, 32)``. Anything that is not 64 hex digits (an empty
    string: a kept request without text hashes) gives 32 zero bytes. An Arrow array is
    decoded in numpy from its buffers, with no Python object per row."""
    if isinstance(hex_hashes, (pa.Array, pa.ChunkedArray)):
        array = (
            hex_hashes.combine_chunks() if isinstance(hex_hashes, pa.ChunkedArray) else hex_hashes
        )
        array = array.cast(pa.string())
        n = len(array)
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[
            array.offset : array.offset + n + 1
        ]
        if n and array.null_count == 0 and (np.diff(offsets) == 64).all():
            data = array.buffers()[2]  # the digits of every hash, back to back
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                raw = bytes.fromhex(data.to_pybytes()[offsets[0] : offsets[-1]].decode("ascii"))
                return np.frombuffer(raw, dtype=np.uint8).reshape(n, 32)
        hex_hashes = array.to_pylist()
    values = [h if h and len(h) == 64 else "0" * 64 for h in hex_hashes]
    try:
        return np.frombuffer(bytes.fromhex("".join(values)), dtype=np.uint8).reshape(-1, 32)
    except ValueError:  # not hex: zeros for those, as for empty ones
        return np.stack([_one(v) for v in values]) if values else np.zeros((0, 32), dtype=np.uint8)


def hex_digests(raw: bytes) -> pa.Array:
    """Arrow strings of the 64-hex-digit SHA-256s whose 32-byte digests are ``raw``, back to
    back (the inverse of ``digests``): one ``bytes.hex`` for all of them, no ``str`` per row."""
    n = len(raw) // 32
    offsets = np.arange(0, 64 * n + 1, 64, dtype=np.int32)
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(raw.hex().encode("ascii"))
    )


def _one(value: str) -> np.ndarray:
    try:
        return np.frombuffer(bytes.fromhex(value), dtype=np.uint8)
    except ValueError:
        return np.zeros(32, dtype=np.uint8)


class Scratch:
    """A private local directory for one run's spill files; see the module docstring.

    Build with ``Scratch.create(root)``; ``path`` is the directory. ``close()`` deletes it
    (idempotent; a ``lent`` one is left to its owner). Thread-safe for distinct file names.
    """

    def __init__(self, path: Path, lock_fd: int | None) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    @classmethod
    def create(cls, root: str | os.PathLike[str]) -> Scratch:
        """Make ``{root}/scratch/{random token}/`` and lock it; first delete the scratch
        directories of processes that died under ``root``.

        :raises DiskFullError: the filesystem of ``root`` is full.
        :raises OSError: ``root`` cannot be created or written.
        """
        base = Path(root) / "scratch"
        with translate_full(str(base), "scratch directory"):
            making = _make_locked_dir(base)
            token = making.name[1:]
            fd = os.open(making / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path = base / token
            making.rename(path)
        scratch = cls(path, fd)
        with _live_lock:
            _live[path] = scratch
        return scratch

    @classmethod
    def lent(cls, path: str | os.PathLike[str]) -> Scratch:
        """A scratch directory another process created, holds (locked) and deletes, lent to
        this one to write into (``cli/plan_ahead.py``): ``close`` leaves it alone."""
        return cls(Path(path), None)

    def reset(self) -> None:
        """Delete everything in the directory but its lock (a planning pass starting over)."""
        for entry in self.path.iterdir():
            if entry.name == _LOCK:
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def file(self, name: str) -> Path:
        """The path of scratch file ``name`` (not created)."""
        return self.path / name

    def spill(self, name: str, dtype: np.dtype[Any], *, buffer_rows: int = 1 << 16) -> Spill:
        """A new ``Spill`` of ``dtype`` records under ``{path}/{name}/``."""
        return Spill(self.path / name, dtype, buffer_rows=buffer_rows)

    def close(self) -> None:
        """Delete the directory and release its lock (idempotent); then ``scratch/`` too
        if that left it empty (it sits beside a ledger the user placed anywhere)."""
        if self._lock_fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None
        with _live_lock:
            _live.pop(self.path, None)
        _remove_if_empty(self.path.parent)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _make_locked_dir(base: Path) -> Path:
    """Make ``base`` and, in it, ``.{token}`` (the caller locks it, under a dot-name the
    sweep skips, then renames it: never swept unlocked); first sweep the dead. ``base`` may
    vanish meanwhile (another process removed it empty, ``_remove_if_empty``): made again."""
    for attempt in range(3):
        base.mkdir(parents=True, exist_ok=True)
        try:
            sweep_dead(base)
            making = base / f".{secrets.token_hex(8)}"
            making.mkdir()
            return making
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _remove_if_empty(base: Path) -> None:
    """Remove the directory ``base`` if it is empty (``rmdir`` refuses otherwise)."""
    with contextlib.suppress(OSError):
        base.rmdir()


def sweep_dead(base: Path) -> list[Path]:
    """Delete the scratch directories under ``base`` whose lock no process holds (their
    owner died); return them. A directory being created (a dot-name) is left unless it is
    over an hour old. Only what ``Scratch.create`` makes is touched: a directory named by
    its 16-hex-digit token (``.`` and the token while being made, holding nothing but its
    lock). ``base`` is ``scratch/`` in the directory of a ledger the user placed anywhere
    (``--ledger ~/x.sqlite3``), so anything else in it is the user's and stays."""
    swept = []
    for path in base.iterdir():
        lock = path / _LOCK
        if path.is_symlink() or not path.is_dir():
            continue
        if path.name.startswith("."):  # being made; an hour old: its maker died making it
            if _TOKEN.match(path.name[1:]):
                with contextlib.suppress(OSError):
                    if time.time() - path.stat().st_mtime > _MAKING_S and set(os.listdir(path)) <= {
                        _LOCK
                    }:
                        shutil.rmtree(path, ignore_errors=True)
            continue
        if not _TOKEN.match(path.name) or path in _live or not lock.exists():
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # alive
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        swept.append(path)
    return swept


def release(path: str | os.PathLike[str] | None) -> None:
    """Close (delete) the scratch directory at ``path`` if this process created it and has
    not closed it yet; anything else is left alone."""
    if path is None:
        return
    with _live_lock:
        scratch = _live.get(Path(path))
    if scratch is not None:
        scratch.close()


@exit_cleanup
def _remove_live() -> None:
    with _live_lock:
        paths = list(_live)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
        _remove_if_empty(path.parent)


class Spill:
    """Fixed-size records (a numpy structured ``dtype``) appended to one file per partition.

    ``add(records, partitions)`` copies records with their partition numbers (ints ≥ 0) into
    a buffer of ``buffer_rows`` records; when it is full, or on ``flush()``, each
    partition's records are appended to ``{directory}/{partition}.bin`` in the order added.
    ``reserve(n)`` and ``commit`` fill the buffer in place instead (no copy of the caller's
    own). ``read(p)`` returns partition ``p``'s records (flushing first); ``partitions()``
    the partitions written. Memory: the buffer (``buffer_rows`` × ``dtype.itemsize`` bytes,
    made at the first record and kept: the same pages each time, where a buffer per call
    costs a page fault per 4 KiB) plus what ``read`` returns. Not thread-safe: one
    writer.

    :raises DiskFullError: (from ``add``/``commit``/``flush``) the scratch filesystem is full.
    """

    def __init__(
        self, directory: Path, dtype: np.dtype[Any], *, buffer_rows: int = 1 << 16
    ) -> None:
        self.directory = directory
        self.dtype = np.dtype(dtype)
        self.buffer_rows = buffer_rows
        self.rows = 0  # records added so far
        self._records: np.ndarray | None = None  # the buffer, made at the first record
        self._parts = np.zeros(0, dtype=np.int64)
        self._buffered = 0
        directory.mkdir(parents=True, exist_ok=True)
        # a spill opened again (by path) reads what an earlier writer flushed
        self._written: set[int] = {int(p.stem) for p in directory.glob("*.bin")}

    def add(self, records: np.ndarray, partitions: np.ndarray | int) -> None:
        """Append ``records`` (of ``dtype``); ``partitions``: one int for all, or one each."""
        records = np.asarray(records, dtype=self.dtype)
        parts = (
            np.full(len(records), partitions, dtype=np.int64)
            if isinstance(partitions, (int, np.integer))
            else np.asarray(partitions, dtype=np.int64)
        )
        start = 0
        while start < len(records):
            room = self.reserve(len(records) - start)
            stop = start + len(room)
            room[:] = records[start:stop]
            self.commit(len(room), parts[start:stop])
            start = stop

    def reserve(self, rows: int) -> np.ndarray:
        """A view of the buffer's next ``min(rows, buffer_rows)`` records (flushing first
        if fewer are free), to fill and ``commit``; the records are not added until then."""
        if self._records is None:
            self._records = np.empty(self.buffer_rows, dtype=self.dtype)
            self._parts = np.empty(self.buffer_rows, dtype=np.int64)
        if self.buffer_rows - self._buffered < min(rows, self.buffer_rows):
            self.flush()
        start = self._buffered
        return self._records[start : start + min(rows, self.buffer_rows - start)]

    def commit(self, rows: int, partitions: np.ndarray | int) -> None:
        """Add the first ``rows`` records of the last ``reserve``'s view, with their
        ``partitions`` (one int for all, or one each)."""
        start = self._buffered
        self._parts[start : start + rows] = partitions
        self._buffered += rows
        self.rows += rows
        if self._buffered >= self.buffer_rows:
            self.flush()

    def flush(self) -> None:
        """Append the buffered records to their partitions' files."""
        if not self._buffered or self._records is None:
            return
        n, self._buffered = self._buffered, 0
        blob = np.dtype((np.void, self.dtype.itemsize))  # moved as bytes: 4x faster than
        records = self._records[:n].view(blob)  # field by field
        parts = self._parts[:n]
        steps = np.diff(parts)
        order = None if (steps >= 0).all() else stable_order(parts)
        if order is not None:
            parts = parts[order]
            steps = np.diff(parts)
        bounds = np.flatnonzero(steps) + 1
        with translate_full(str(self.directory), "scratch directory"):
            for start, stop in zip(np.r_[0, bounds], np.r_[bounds, n], strict=True):
                part = int(parts[start])
                rows = records[start:stop] if order is None else records[order[start:stop]]
                with open(self.directory / f"{part}.bin", "ab") as fh:
                    fh.write(memoryview(rows))  # type: ignore[arg-type]  # numpy's stubs: no Buffer
                self._written.add(part)

    def partitions(self) -> list[int]:
        """The partitions that hold records, ascending (flushes first)."""
        self.flush()
        return sorted(self._written)

    def read(self, partition: int) -> np.ndarray:
        """Partition ``partition``'s records in the order added (empty if none)."""
        self.flush()
        path = self.directory / f"{partition}.bin"
        if partition not in self._written:
            return np.zeros(0, dtype=self.dtype)
        return np.fromfile(path, dtype=self.dtype)

    def drop(self, partition: int) -> None:
        """Delete a partition's file (read and no longer needed)."""
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{partition}.bin").unlink()
        self._written.discard(partition)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(partition, records)`` for every partition, ascending."""
        for part in self.partitions():
            yield part, self.read(part)
