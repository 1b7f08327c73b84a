"""Start a Prefect server whose UI talks to the port it serves, on SQLite or PostgreSQL.

    .venv/bin/python deployments/server.py                      # http://127.0.0.1:4200
    .venv/bin/python deployments/server.py --port 4371           # port 4200 taken
    .venv/bin/python deployments/server.py --database-url postgresql+asyncpg://USER@HOST:5432/prefect

Why not ``prefect server start --port 4371``: the port flag moves the API, but the UI's API
address (``PREFECT_UI_API_URL``) is decided from ``PREFECT_API_URL`` when that is set (a
profile saved for 4200) or else from ``PREFECT_SERVER_API_PORT`` (4200 by default), never
from ``--port`` (prefect/settings/models/root.py, Prefect 3.x): the UI then shows "Can't
connect to Server API at http://127.0.0.1:4200/api". This sets ``PREFECT_SERVER_API_HOST``,
``PREFECT_SERVER_API_PORT`` and ``PREFECT_UI_API_URL`` from the same host and port.

``--database-url`` sets ``PREFECT_API_DATABASE_CONNECTION_URL`` (Prefect's setting for its
own database; asyncpg is the driver Prefect ships with). Prefect creates its tables on start
(``PREFECT_API_DATABASE_MIGRATE_ON_START``, default true); the database must exist.
A password belongs in ``PGPASSWORD`` or ``~/.pgpass``, not in the URL shown in ``ps``.
Ctrl-C stops the server; ``exec`` leaves no process behind this one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

__all__ = ["server_command", "server_env"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200
#: Bind addresses that mean "every interface": no browser can connect to them.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def server_env(
    base: Mapping[str, str],
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    database_url: str | None = None,
) -> dict[str, str]:
    """``base`` plus the settings that make the API, the UI's API address and the database
    agree: ``PREFECT_SERVER_API_HOST``/``PORT``, ``PREFECT_UI_API_URL`` =
    ``http://HOST:PORT/api`` (``/api``, relative to the page, for a wildcard ``HOST`` such
    as ``0.0.0.0``: no browser can use that address, and one on another machine reaches
    the UI by a name only it knows), and ``PREFECT_API_DATABASE_CONNECTION_URL`` when given.
    ``PREFECT_API_URL`` is dropped: it is the client's setting, and a stale one would win
    over the port for the UI. Analytics are off."""
    env = {k: v for k, v in base.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_SERVER_API_HOST=host,
        PREFECT_SERVER_API_PORT=str(port),
        PREFECT_UI_API_URL="/api" if host in _WILDCARD_HOSTS else f"http://{host}:{port}/api",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    return env


def server_command(python: str = sys.executable) -> list[str]:
    """The command ``server_env`` goes with: ``python -m prefect server start`` (host and
    port come from the environment)."""
    return [python, "-m", "prefect", "server", "start"]


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return port


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``--host``, ``--port``, ``--database-url``; replace this process with the server."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT)
    parser.add_argument(
        "--database-url",
        default=None,
        help="e.g. postgresql+asyncpg://USER@HOST:5432/DB (default: SQLite in PREFECT_HOME)",
    )
    args = parser.parse_args(argv)
    env = server_env(os.environ, host=args.host, port=args.port, database_url=args.database_url)
    print(
        f"Prefect server: API http://{args.host}:{args.port}/api, UI "
        f"http://{args.host}:{args.port}",
        flush=True,
    )
    command = server_command()
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main()
