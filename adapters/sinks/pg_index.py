"""The pgvector HNSW index build: the settings it runs with, and its progress lines
(docs/reference/sinks.md, "The index").

pgvector builds an HNSW index much faster while the whole graph fits in
``maintenance_work_mem`` (64 MB by default; past it, the build goes on on disk pages, and
pgvector says "hnsw graph no longer fits into maintenance_work_mem"), and in parallel with
``max_parallel_maintenance_workers`` (pgvector ≥ 0.6). Source: pgvector README, "Index Build
Time". Both are set for the build's transaction only (``set_config(…, true)``, i.e. ``SET
LOCAL``: a pooler in transaction mode sees no session setting), sized to the server:

- memory: the graph's estimate with 25 % headroom, up to a quarter of the server's memory
  when it can be read (``/proc/meminfo`` through ``pg_read_file``, for a superuser or
  ``pg_read_server_files``; else this machine's when the server runs on it), else up to
  1 GB; never below the server's own value. A graph larger than that: one line says what
  to set (``maintenance_work_mem`` in MB) for the build to run in memory.
- workers: at most 7 (the pgvector README's example), within the server's
  ``max_parallel_workers`` and ``max_worker_processes``, and below its cores (the build's
  leader is a process too: cores - 1 workers) when they can be read (``/proc/cpuinfo``, as
  above). Cores unknown: never above the server's own ``max_parallel_maintenance_workers``.
- ``statement_timeout`` 0 for the build's transaction: a role with a timeout (managed
  services set one) would cancel a long build.

Progress: PostgreSQL reports a running ``CREATE INDEX`` in ``pg_stat_progress_create_index``
(phase, tuples done; pgvector fills both), read on a second connection.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from embedline.progress import PROGRESS_LOGGER

__all__ = [
    "GRAPH_BYTES_PER_ROW",
    "HALFVEC_MAX_DIMENSIONS",
    "MAX_BUILD_MEMORY_KB",
    "MAX_BUILD_WORKERS",
    "VECTOR_MAX_DIMENSIONS",
    "ServerResources",
    "graph_bytes",
    "index_build_settings",
    "index_method",
    "index_state",
    "progress_lines",
    "server_resources",
]

logger = logging.getLogger("embedline")
progress_logger = logging.getLogger(PROGRESS_LOGGER)

#: Bytes of pgvector's in-memory HNSW graph per row beyond the vector's 4·d: the element and
#: its level-0 neighbour list at the default m = 16 (2·m candidates), with upper levels.
GRAPH_BYTES_PER_ROW = 700
MAX_BUILD_MEMORY_KB = 1024 * 1024  # the cap when the server's memory is unknown: 1 GB
MAX_BUILD_WORKERS = 7  # pgvector README: "SET max_parallel_maintenance_workers = 7"
#: pgvector's HNSW limits: "vector - up to 2,000 dimensions", "halfvec - up to 4,000".
VECTOR_MAX_DIMENSIONS = 2000
HALFVEC_MAX_DIMENSIONS = 4000
_HEADROOM = 1.25
_MEMORY_SHARE = 4  # a build takes at most a quarter of the server's memory


def graph_bytes(rows: int, dimensions: int, *, bytes_per_dimension: int = 4) -> int:
    """An estimate of pgvector's HNSW graph over ``rows`` vectors of ``dimensions`` (bytes):
    ``rows · (bytes_per_dimension·dimensions + GRAPH_BYTES_PER_ROW)``; 4 bytes a dimension
    for ``vector``, 2 for ``halfvec``."""
    return rows * (bytes_per_dimension * dimensions + GRAPH_BYTES_PER_ROW)


@dataclass(frozen=True, slots=True)
class ServerResources:
    """What the database server's machine has, where it could be read (None: unknown)."""

    cores: int | None
    memory_bytes: int | None


def _setting(conn: Any, name: str) -> int:
    return int(
        conn.execute("SELECT setting::bigint FROM pg_settings WHERE name = %s", (name,)).fetchone()[
            0
        ]
    )


def _read_server_file(conn: Any, path: str) -> str | None:
    """The text of ``path`` on the server's machine (``pg_read_file``, in a savepoint: a
    role without the right gets None, and the transaction goes on)."""
    import psycopg

    try:
        with conn.transaction():
            row = conn.execute("SELECT pg_read_file(%s)", (path,)).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(row[0])


def _server_is_local(conn: Any) -> bool:
    """The server runs on this machine: reached over a Unix socket or a loopback address."""
    address = conn.execute("SELECT host(inet_server_addr())").fetchone()[0]
    return address is None or address in ("127.0.0.1", "::1")


def server_resources(conn: Any) -> ServerResources:
    """The server's cores and memory: from its ``/proc`` (``pg_read_file``), else this
    machine's when the server runs here, else unknown."""
    cpuinfo = _read_server_file(conn, "/proc/cpuinfo")
    meminfo = _read_server_file(conn, "/proc/meminfo")
    cores = len(re.findall(r"^processor\s*:", cpuinfo, re.MULTILINE)) if cpuinfo else None
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo or "", re.MULTILINE)
    memory = int(match.group(1)) * 1024 if match else None
    if (cores is None or memory is None) and _server_is_local(conn):
        cores = cores or os.cpu_count()
        with suppress(OSError, ValueError):
            memory = memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ServerResources(cores or None, memory or None)


def index_build_settings(
    conn: Any,
    *,
    rows: int,
    dimensions: int,
    bytes_per_dimension: int = 4,
    resources: ServerResources | None = None,
    advice: str = "",
) -> dict[str, str]:
    """The settings to run one HNSW build with (see the module docstring):
    ``maintenance_work_mem`` when more than the server's own is
    wanted; ``max_parallel_maintenance_workers`` when it differs from the server's (raised,
    or lowered to the server's cores). ``resources``: the server's (default: read with
    ``server_resources``). A graph that cannot fit gets one WARNING naming the value to set;
    ``advice`` ends that line (e.g. how to build the index later, once it is set)."""
    resources = server_resources(conn) if resources is None else resources
    settings: dict[str, str] = {}
    graph = graph_bytes(rows, dimensions, bytes_per_dimension=bytes_per_dimension)
    have_kb = _setting(conn, "maintenance_work_mem")  # pg_settings unit: kB
    cap_kb = (
        resources.memory_bytes // _MEMORY_SHARE // 1024
        if resources.memory_bytes
        else MAX_BUILD_MEMORY_KB
    )
    want_kb = min(cap_kb, int(graph * _HEADROOM) // 1024)
    if want_kb > have_kb:
        settings["maintenance_work_mem"] = f"{want_kb // 1024}MB"
    if graph // 1024 > max(have_kb, want_kb):
        need_mb = -(-int(graph * _HEADROOM) // (1024 * 1024))
        logger.warning(
            "the HNSW graph of %d rows × %d dimensions (about %d MB) does not fit in the "
            "%d MB the build gets, so it goes on slower on disk: set maintenance_work_mem = "
            "'%dMB' on the server (ALTER SYSTEM, or ALTER ROLE … SET)%s%s",
            rows,
            dimensions,
            graph >> 20,
            max(have_kb, want_kb) >> 10,
            need_mb,
            f" — it has {resources.memory_bytes >> 20} MB of memory"
            if resources.memory_bytes
            else "",
            advice,
        )
    have_workers = _setting(conn, "max_parallel_maintenance_workers")
    want_workers = min(
        MAX_BUILD_WORKERS,
        _setting(conn, "max_parallel_workers"),
        _setting(conn, "max_worker_processes"),
    )
    if resources.cores is not None:
        want_workers = max(0, min(want_workers, resources.cores - 1))
    else:
        want_workers = min(want_workers, have_workers)
    if want_workers != have_workers:
        settings["max_parallel_maintenance_workers"] = str(want_workers)
    return settings


def index_state(conn: Any, name: str) -> str:
    """``"missing"``, ``"valid"`` or ``"invalid"`` (``pg_index.indisvalid`` false: left by a
    cancelled ``CREATE INDEX CONCURRENTLY``): the index ``name`` (quoted as ``to_regclass``
    takes it), in ``conn``'s transaction."""
    row = conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
    ).fetchone()
    return "missing" if row is None else "valid" if row[0] else "invalid"


def index_method(dimensions: int) -> Any:
    """``USING hnsw (…)`` for vectors of ``dimensions``: ``embedding vector_cosine_ops`` up to
    2,000, the expression ``(embedding::halfvec(d)) halfvec_cosine_ops`` up to 4,000
    (pgvector README, "Half-Precision Indexing"); None above (pgvector indexes no longer
    vectors)."""
    from psycopg import sql

    if dimensions <= VECTOR_MAX_DIMENSIONS:
        return sql.SQL("USING hnsw (embedding vector_cosine_ops)")
    if dimensions <= HALFVEC_MAX_DIMENSIONS:
        return sql.SQL("USING hnsw ((embedding::halfvec({})) halfvec_cosine_ops)").format(
            sql.Literal(dimensions)
        )
    return None


@contextmanager
def progress_lines(
    dsn: str,
    pid: int,
    identity: str,
    rows: int,
    interval_s: float,
    on_progress: Callable[[int, int], None] | None = None,
) -> Iterator[None]:
    """While the body runs, log every ``interval_s`` seconds how far backend ``pid``'s
    ``CREATE INDEX`` got (phase, rows done of ``rows``), on a connection of its own, and
    hand ``on_progress(done, total)`` the same counts (it must return at once: the flow's
    progress artifact). A failure to read the progress is logged once at DEBUG and ends the
    lines, never the build."""
    stop = threading.Event()
    thread = threading.Thread(
        target=_report,
        args=(dsn, pid, identity, rows, interval_s, stop, on_progress),
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
    dsn: str,
    pid: int,
    identity: str,
    rows: int,
    interval_s: float,
    stop: threading.Event,
    on_progress: Callable[[int, int], None] | None,
) -> None:
    import psycopg

    started = time.monotonic()
    try:
        # no prepared statements (PgBouncer in transaction mode: adapters.sinks.pgvector)
        with psycopg.connect(
            dsn, connect_timeout=10, autocommit=True, prepare_threshold=None
        ) as conn:
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
                if on_progress is not None:
                    on_progress(int(done or 0), total)
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
