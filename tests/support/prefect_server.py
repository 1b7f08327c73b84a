"""One real ``prefect server start`` on loopback for the whole test session.

Its own temporary ``PREFECT_HOME``, so tests never touch a user's Prefect. In-process flows and
CLI subprocesses both reach it through ``PREFECT_API_URL`` (set in ``os.environ`` for the
session). Start-up costs about 15 s here (../shared/STACK-NOTES.md): once per session.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

__all__ = ["prefect_api_url", "start_prefect_server"]

_STARTUP_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_prefect_server(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start a Prefect server with ``PREFECT_HOME=home``; return it and its API URL.

    :raises RuntimeError: it did not answer ``/api/health`` within 120 s.
    """
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api"
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


@pytest.fixture(scope="session")
def prefect_api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Session-scoped Prefect server; sets ``PREFECT_API_URL`` for the session."""
    home = tmp_path_factory.mktemp("prefect-server")
    proc, url = start_prefect_server(home)
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
