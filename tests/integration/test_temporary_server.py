"""The CLI's temporary Prefect server starts lean: it is on every first run's critical path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.prefect_home import fresh_prefect_home


def test_the_temporary_server_does_not_import_the_installed_prefect_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefect's block registration (and the hash that memoizes it) imports every installed
    collection at start: prefect-dask brought dask, distributed and numpy into the server,
    0.4 s of its 4-5 s start. numpy's C core in the server's memory map shows it."""
    from cli.local_server import LocalServer

    monkeypatch.setenv("PREFECT_HOME", str(fresh_prefect_home(tmp_path / "home")))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    server = LocalServer().start()
    try:
        server.wait_ready(120)
        assert server.process is not None
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    finally:
        server.stop()
    assert "_multiarray_umath" not in maps, "numpy was imported by the temporary server"
    assert os.environ.get("PREFECT_API_BLOCKS_REGISTER_ON_START") is None  # the CLI's own env
