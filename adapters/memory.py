"""Keep the process's allocators from holding memory the run has freed.

Measured on a 100,000-row reused night (chunk tasks on 9 threads, each parsing 5,000 rows and
building Arrow tables): peak RSS 536 MB with the defaults, 333 MB with both settings below,
for the same work and CPU. Two allocators were keeping freed memory:

- glibc's malloc gives each thread that allocates its own arena (up to 8 per core) and
  returns little of a fragmented arena to the OS; ``mallopt(M_ARENA_MAX, 2)`` caps them
  (glibc manual, "Memory Allocation Tunables": ``glibc.malloc.arena_max``, set here at run
  time because the CLI's process has started before it could read ``MALLOC_ARENA_MAX``).
  And its mmap threshold, which glibc raises on its own up to 32 MiB as large blocks are
  freed (so later large buffers land in the heap and stay): fixed at 4 MiB
  (``M_MMAP_THRESHOLD``), blocks above it are mapped and unmapped, never kept. Measured on
  the change set's sort: peak RSS 1.43x from 100k to 10M rows without it, 1.16x with it
  at 1 MiB, same CPU (128 KiB gave 1.13x for 35 % more CPU). 1 MiB was too low for the
  run's own working buffers (a 1 MiB planning block decoded and parsed, a chunk's 1.6 MB
  Parquet body, a request's answer): each was mapped, faulted in page by page and unmapped
  again, 850,000 page faults to plan 317 MB. With 4 MiB, and the heap trimmed only above
  16 MiB free at its top (``M_TRIM_THRESHOLD``; glibc's 128 KiB default gave those pages
  back after every block, to fault them in again), a 1M-row reused night took 14.7 CPU
  seconds instead of 18.6 (system time 5.3 -> 1.8 s) and a first run 42.1 instead of
  47.3;
- pyarrow's default pool (jemalloc or mimalloc in the wheels) caches freed pages; its system
  pool hands them back to malloc. Arrow's C++ reads ``ARROW_DEFAULT_MEMORY_POOL`` once, at
  its first allocation (the Parquet reader uses that pool whatever
  ``pyarrow.set_memory_pool`` says: measured, 481 MB instead of 322 MB), so the variable is
  set before pyarrow is first used: at the CLI's entry before its commands are imported,
  when ``flows`` is imported (the package a deployment's process loads first), and in each
  Dask worker's preload. This module imports nothing heavy, and the ``adapters`` package
  loads its other modules lazily, so importing it is never too late (it was, from the CLI
  and from ``flows``, while the package imported every adapter, pyarrow among them:
  ``tests/unit/adapters/test_memory.py``).

An explicit ``ARROW_DEFAULT_MEMORY_POOL`` or glibc variable in the environment wins, each for
its own setting.
Elsewhere than glibc (macOS, musl) the malloc part does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["keep_memory_flat"]

_M_ARENA_MAX = -8  # malloc.h
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1
_ARENAS = 2
_MMAP_THRESHOLD = 4 << 20  # bytes
_TRIM_THRESHOLD = 16 << 20  # bytes
_done = False


def keep_memory_flat() -> None:
    """Apply the settings once per process (idempotent, never raises); each glibc one is
    left to its environment variable when that is set (``MALLOC_ARENA_MAX``,
    ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``: glibc read it at start)."""
    global _done
    if _done:
        return
    _done = True
    wanted = [(param, value) for param, value, variable in (
        (_M_ARENA_MAX, _ARENAS, "MALLOC_ARENA_MAX"),
        (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
        (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
    ) if variable not in os.environ]
    if wanted:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            for param, value in wanted:
                libc.mallopt(param, value)
        except (OSError, AttributeError):
            pass  # not glibc
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
