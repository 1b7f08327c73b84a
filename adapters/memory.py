"""Keep the process's allocators from holding memory the run has freed.

Two allocators keep freed memory unless told otherwise; ``keep_memory_flat`` tells them:

- glibc's malloc gives each thread that allocates its own arena (up to 8 per core) and
  returns little of a fragmented arena to the OS; ``mallopt(M_ARENA_MAX, 2)`` caps them
  (glibc manual, "Memory Allocation Tunables": ``glibc.malloc.arena_max``, set here at run
  time because the CLI's process has started before it could read ``MALLOC_ARENA_MAX``).
  glibc also raises its mmap threshold on its own, up to 32 MiB, as large blocks are freed,
  so later large buffers land in the heap and stay: the threshold is fixed at 1 MiB
  (``M_MMAP_THRESHOLD``), and blocks above it are mapped and unmapped, never kept. The chunk
  tasks' working buffers of 1-4 MiB (a chunk's text, its Parquet body, copied vectors), made
  and freed on several threads at once, would fragment a heap they landed in. Planning is the
  exception: one thread, a block at a time, each block's bytes, text and ``StringIO`` (up to
  4x the block's bytes) freed before the next is made, so the heap reuses them exactly;
  ``large_buffers_reused`` raises the threshold to 4 MiB around it, which spares a page fault
  per 4 KiB of every block. The heap is trimmed only above 16 MiB free at its top
  (``M_TRIM_THRESHOLD``): glibc's 128 KiB default gives the pages back after every planning
  block, to fault them in again;
- pyarrow's default pool (jemalloc or mimalloc in the wheels) caches freed pages; its system
  pool hands them back to malloc. Arrow's C++ reads ``ARROW_DEFAULT_MEMORY_POOL`` once, at
  its first allocation (the Parquet reader uses that pool whatever
  ``pyarrow.set_memory_pool`` says), so the variable is set before pyarrow is first used: at
  the CLI's entry before its commands are imported, when ``flows`` is imported (the package a
  deployment's process loads first), and in each Dask worker's preload. This module imports
  nothing heavy, and the ``adapters`` package loads its other modules lazily, so importing it
  is never too late (``tests/unit/adapters/test_memory.py`` checks it).

With both, a reused night peaks at about three fifths of the RSS the defaults give, for the
same work and CPU, and the peak stays nearly flat from 100,000 to 10 million rows
(``benchmarks/LOG.md`` holds the measurements).

An explicit ``ARROW_DEFAULT_MEMORY_POOL`` or glibc variable in the environment wins, each for
its own setting.
Elsewhere than glibc (macOS, musl) the malloc part does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator

__all__ = ["keep_memory_flat", "large_buffers_reused"]

_M_ARENA_MAX = -8  # malloc.h
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1
_ARENAS = 2
_MMAP_THRESHOLD = 1 << 20  # bytes
_PLANNING_MMAP_THRESHOLD = 4 << 20  # bytes
_TRIM_THRESHOLD = 16 << 20  # bytes
_done = False
_libc: ctypes.CDLL | None = None  # set when this module chose the mmap threshold
_planning = 0  # large_buffers_reused() blocks open, across threads
_planning_lock = threading.Lock()


def keep_memory_flat() -> None:
    """Apply the settings once per process (idempotent, never raises); each glibc one is
    left to its environment variable when that is set (``MALLOC_ARENA_MAX``,
    ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``: glibc read it at start)."""
    global _done, _libc
    if _done:
        return
    _done = True
    wanted = [
        (param, value)
        for param, value, variable in (
            (_M_ARENA_MAX, _ARENAS, "MALLOC_ARENA_MAX"),
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
        )
        if variable not in os.environ
    ]
    if wanted:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            for param, value in wanted:
                libc.mallopt(param, value)
            if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
                _libc = libc
        except (OSError, AttributeError):
            pass  # not glibc
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


@contextlib.contextmanager
def large_buffers_reused() -> Iterator[None]:
    """Within the block, glibc's mmap threshold is 4 MiB instead of 1 MiB: for planning,
    whose buffers of 1-4 MiB come one at a time on one thread (module docstring). Nests and
    overlaps across threads (the threshold drops back when the last block ends); does
    nothing unless ``keep_memory_flat`` set the threshold."""
    global _planning
    with _planning_lock:
        _planning += 1
        if _planning == 1 and _libc is not None:
            _libc.mallopt(_M_MMAP_THRESHOLD, _PLANNING_MMAP_THRESHOLD)
    try:
        yield
    finally:
        with _planning_lock:
            _planning -= 1
            if _planning == 0 and _libc is not None:
                _libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
