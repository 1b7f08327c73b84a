"""A private PostgreSQL server with pgvector for the sink tests (PyPI ``pgserver``).

``pgserver`` ships PostgreSQL 16 binaries with the pgvector extension inside its wheel, so a
clean clone needs nothing but ``pip install`` (``make test`` does it): ``get_server(DIR)``
runs ``initdb`` into DIR once, starts ``postgres`` listening on a Unix socket in DIR (no TCP
port), and stops it when the session ends (``cleanup_mode="stop"``; also at interpreter exit).
Run as root, it starts the server as a system user ``pgserver`` that it creates.
The URI has no password: the server trusts local socket connections.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["pg_uri"]


@pytest.fixture(scope="session")
def pg_uri() -> Iterator[str]:
    """``postgresql://postgres:@/postgres?host=DIR`` of a server started for this session.

    DIR is a fresh directory directly under the system temp dir: pytest's own temp tree is
    private to root (0700), which the ``pgserver`` user cannot enter to stop the server.
    """
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver

    data = Path(tempfile.mkdtemp(prefix="embedline-test-pg-"))
    os.chmod(data, 0o755)
    server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)
