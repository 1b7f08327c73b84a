"""One real ``prefect server start`` on loopback for the whole test session.

Its own temporary ``PREFECT_HOME``, so tests never touch a user's Prefect. In-process flows and
CLI subprocesses both reach it through ``PREFECT_API_URL`` (set in ``os.environ`` for the
session). Start-up costs about 15 s here (../shared/STACK-NOTES.md): once per session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deployments.server import server_command, server_env
from tests.support.processes import die_with_parent

__all__ = [
    "param_arguments",
    "prefect_api_url",
    "start_prefect_server",
    "start_prefect_worker",
    "stop_prefect_worker",
]

_STARTUP_S = 120.0


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start_prefect_server(
    home: Path,
    *,
    ui: bool = False,
    database_url: str | None = None,
    host: str = "127.0.0.1",
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a Prefect server with ``PREFECT_HOME=home`` the way deployments/README.md says
    (``deployments/server.py``: host, port and the UI's API address set together), on a free
    port of ``host`` (a non-loopback address: reachable from other network namespaces), with
    its UI only when ``ui``, on ``database_url`` (PostgreSQL) or SQLite in ``home``, its
    scheduler service off (no deployment's schedule starts a run); return it and its API URL.

    :raises RuntimeError: it did not answer ``/api/health`` within 120 s.
    """
    port = _free_port(host)
    base = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_UI_ENABLED": str(ui).lower(),
        # No scheduled runs: the tests deploy the sample's schedules (the nightly at 02:30
        # Europe/Berlin), and a suite running at that hour had the scheduler start the real
        # nightly on a test's worker, taking the deployment's one slot (CANCEL_NEW) from the
        # run the test started. Tests read the schedules; none waits for one to fire.
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
    }
    env = server_env(base, host=host, port=port, database_url=database_url)
    log = open(home / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        server_command(),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    url = f"http://{host}:{port}/api"
    deadline = time.monotonic() + _STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited: see {home / 'server.log'}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"prefect server did not start in {_STARTUP_S} s")


def prefect_database(pg_uri: str) -> str:
    """Create a database of its own for a Prefect server on the PostgreSQL of ``pg_uri``
    (``postgresql://…?host=SOCKET_DIR``); return its ``postgresql+asyncpg://`` URL (the
    driver Prefect ships with, over the same Unix socket)."""
    import uuid
    from urllib.parse import parse_qs, urlsplit

    import psycopg

    name = f"prefect_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(pg_uri)
    host = parse_qs(parts.query)["host"][0]
    return f"postgresql+asyncpg://{parts.username or 'postgres'}@/{name}?host={host}"


@pytest.fixture(scope="session")
def prefect_api_url(tmp_path_factory: pytest.TempPathFactory, pg_uri: str) -> Iterator[str]:
    """Session-scoped Prefect server as production runs it (deployments/README.md): on
    PostgreSQL, with its UI, started by ``deployments/server.py``'s settings; sets
    ``PREFECT_API_URL`` for the session. (The CLI's temporary server, on SQLite, serves
    the tests that do not ask for this one.)"""
    home = tmp_path_factory.mktemp("prefect-server")
    proc, url = start_prefect_server(home, ui=True, database_url=prefect_database(pg_uri))
    os.environ["PREFECT_API_URL"] = url
    try:
        yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def param_arguments(params: dict[str, object]) -> list[str]:
    """``prefect deployment run``'s ``--param SECTION=JSON`` arguments for the embed-csv
    flow's run options ``params`` (flat names, paths as strings), grouped as the flow takes
    them (``embedline.parameters.grouped``)."""
    import json

    from embedline.parameters import grouped

    flat = {name: str(v) if isinstance(v, Path) else v for name, v in params.items()}
    return [
        arg
        for group, values in grouped(flat).items()
        for arg in ("--param", f"{group}={json.dumps(values)}")
    ]


def start_prefect_worker(
    pool: str, log_path: Path, *, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``prefect worker start --pool POOL`` (polling every second), logging to ``log_path``.

    It uses this interpreter, so the flow runs it spawns do too, and reaches the server in
    ``PREFECT_API_URL`` (from ``env``, else ``os.environ``). Stop it with ``stop_prefect_worker``.
    """
    full_env = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "1", **(env or {})}
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the worker
    return subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool],
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


def _children(pid: int) -> list[int]:
    """Return the pids of ``pid``'s descendants (Linux ``/proc``; empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_prefect_worker(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Stop a worker from ``start_prefect_worker`` and any flow-run process it left running.

    A worker needs two SIGTERMs (../shared/STACK-NOTES.md); flow runs it spawned live in
    sessions of their own, so they are found through ``/proc`` and killed by pid.
    """
    leftovers = _children(proc.pid)
    for _ in range(2):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout / 2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
