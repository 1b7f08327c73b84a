"""The pgvector HNSW index build: the settings it runs with, and its progress lines
(docs/reference/sinks.md).

pgvector builds an HNSW index much faster while the whole graph fits in
``maintenance_work_mem`` (64 MB by default; past it, the build goes on on disk pages, and
pgvector says "hnsw graph no longer fits into maintenance_work_mem"), and in parallel with
``max_parallel_maintenance_workers`` (pgvector ≥ 0.6). Source: pgvector README, "Index Build
Time". Both are set for the build's transaction only (``set_config(…, true)``), and only
ever raised above what the server already has.

Progress: PostgreSQL reports a running ``CREATE INDEX`` in ``pg_stat_progress_create_index``
(phase, tuples done; pgvector fills both), read on a second connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from embedline.progress import PROGRESS_LOGGER

__all__ = [
    "GRAPH_BYTES_PER_ROW",
    "MAX_BUILD_MEMORY_KB",
    "MAX_BUILD_WORKERS",
    "graph_bytes",
    "index_build_settings",
    "progress_lines",
]

logger = logging.getLogger("embedline")
progress_logger = logging.getLogger(PROGRESS_LOGGER)

#: Bytes of pgvector's in-memory HNSW graph per row beyond the vector's 4·d: the element and
#: its level-0 neighbour list at the default m = 16 (2·m candidates), with upper levels.
GRAPH_BYTES_PER_ROW = 700
MAX_BUILD_MEMORY_KB = 1024 * 1024  # never ask for more than 1 GB for one build
MAX_BUILD_WORKERS = 7  # pgvector README: "SET max_parallel_maintenance_workers = 7"
_HEADROOM = 1.25


def graph_bytes(rows: int, dimensions: int) -> int:
    """An estimate of pgvector's HNSW graph over ``rows`` vectors of ``dimensions`` float32
    (bytes): ``rows · (4·dimensions + GRAPH_BYTES_PER_ROW)``."""
    return rows * (4 * dimensions + GRAPH_BYTES_PER_ROW)


def _setting(conn: Any, name: str) -> int:
    return int(
        conn.execute("SELECT setting::bigint FROM pg_settings WHERE name = %s", (name,)).fetchone()[
            0
        ]
    )


def index_build_settings(conn: Any, *, rows: int, dimensions: int) -> dict[str, str]:
    """The settings to run one HNSW build with: ``maintenance_work_mem`` the graph's estimate
    with 25 % headroom (at most 1 GB, never below the server's own value), and
    ``max_parallel_maintenance_workers`` up to 7, within the server's
    ``max_parallel_workers`` (the administrator's cap on parallel workers). Only settings
    raised above the server's are returned."""
    settings: dict[str, str] = {}
    have_kb = _setting(conn, "maintenance_work_mem")  # pg_settings unit: kB
    want_kb = min(MAX_BUILD_MEMORY_KB, int(graph_bytes(rows, dimensions) * _HEADROOM) // 1024)
    if want_kb > have_kb:
        settings["maintenance_work_mem"] = f"{want_kb // 1024}MB"
    if graph_bytes(rows, dimensions) // 1024 > max(have_kb, want_kb):
        logger.warning(
            "the HNSW graph of %d rows × %d dimensions (about %d MB) will not fit "
            "in maintenance_work_mem (%d MB): the build goes on slower on disk; "
            "raise maintenance_work_mem on the server to speed it up",
            rows,
            dimensions,
            graph_bytes(rows, dimensions) >> 20,
            max(have_kb, want_kb) >> 10,
        )
    have_workers = _setting(conn, "max_parallel_maintenance_workers")
    want_workers = min(MAX_BUILD_WORKERS, _setting(conn, "max_parallel_workers"))
    if want_workers > have_workers:
        settings["max_parallel_maintenance_workers"] = str(want_workers)
    return settings


@contextmanager
def progress_lines(
    dsn: str, pid: int, identity: str, rows: int, interval_s: float
) -> Iterator[None]:
    """While the body runs, log every ``interval_s`` seconds how far backend ``pid``'s
    ``CREATE INDEX`` got (phase, rows done of ``rows``), on a connection of its own. A
    failure to read the progress is logged once at DEBUG and ends the lines, never the
    build."""
    stop = threading.Event()
    thread = threading.Thread(
        target=_report,
        args=(dsn, pid, identity, rows, interval_s, stop),
        name="embedline-index-progress",
        daemon=True,
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _report(
    dsn: str, pid: int, identity: str, rows: int, interval_s: float, stop: threading.Event
) -> None:
    import psycopg

    started = time.monotonic()
    try:
        with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
            while not stop.wait(interval_s):
                row = conn.execute(
                    "SELECT phase, tuples_done, tuples_total FROM "
                    "pg_stat_progress_create_index WHERE pid = %s",
                    (pid,),
                ).fetchone()
                if row is None:
                    continue
                phase, done, total = row
                total = int(total or 0) or rows
                progress_logger.info(
                    "%s: building the HNSW index, %s: %d of %d rows (%.0f %%), %.0f s",
                    identity,
                    phase,
                    int(done or 0),
                    total,
                    100.0 * int(done or 0) / max(total, 1),
                    time.monotonic() - started,
                )
    except psycopg.Error as exc:
        logger.debug("%s: no index build progress (%s)", identity, type(exc).__name__)
