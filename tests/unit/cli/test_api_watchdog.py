"""The API watchdog reports a temporary server that exits after it answered, never one that
exits before: that one did not start (``wait_ready`` says so), and its reason, a Prefect
setting Prefect refuses, is the run's one line and exit 2, whichever process reads the
setting first (the server, importing Prefect in its own process, often wins)."""

from __future__ import annotations

import subprocess
import sys

from cli.local_server import LocalServer
from cli.prefect_env import PrefectApi


def _exited_server(*, answered: bool) -> LocalServer:
    server = LocalServer()
    server.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    server.process.wait()
    server.ready = answered
    return server


def test_a_server_that_exits_before_it_answered_is_not_a_lost_api() -> None:
    server = _exited_server(answered=False)
    assert PrefectApi(server.api_url, server)._server_exited() is None


def test_a_server_that_exits_after_it_answered_is_a_lost_api() -> None:
    server = _exited_server(answered=True)
    loss = PrefectApi(server.api_url, server)._server_exited()
    assert loss is not None and "exited during the run" in loss.what
