"""Two more S3 servers for the conditional-write tests: ministack (honours ``If-None-Match``)
and s3rver (ignores it, overwrites silently), each a real process on 127.0.0.1.

Use from ``tests/conftest.py``::

    from tests.support.s3_servers import (  # noqa: F401
        conditional_s3_endpoint, ministack_endpoint, s3rver_server)

- ``ministack_endpoint`` (session): PyPI ``ministack`` (pinned in ``tests/support/ministack/
  requirements.txt``), installed by ``make .venv-ministack/.installed`` into a venv of its own
  (it pins botocore 1.43, embedline 1.44). Started as ``BIND_HOST=127.0.0.1 GATEWAY_PORT=N
  SERVICES=s3 ministack`` (it binds 0.0.0.0 unless told), state in memory; returns
  ``http://127.0.0.1:N``. It takes any credentials, so the session's ``DUMMY_AWS_ENV`` is
  applied as for moto.
- ``s3rver_server`` (session): npm ``s3rver`` (pinned in ``tests/support/s3rver/package.json``
  and its lock file), installed by ``make tests/support/s3rver/node_modules/.installed``;
  started as ``s3rver -a 127.0.0.1 -p N -d DIR --configure-bucket embedline-s3rver`` (keys
  ``S3RVER``/``S3RVER``); returns an ``S3rver`` (endpoint, bucket, ``env()``).
- ``conditional_s3_endpoint`` (function, parametrized ``moto``/``ministack``): the endpoint of
  a server that promises conditional writes, for tests of what embedline relies on.

A missing binary fails the test (not a skip) with the make target that installs it: CI runs
``make test``, which builds both first. ``EMBEDLINE_MINISTACK`` / ``EMBEDLINE_S3RVER`` name
other binaries. Every server process gets ``die_with_parent`` and is terminated (then
killed) when the session ends: none outlives pytest, even a ``kill -9`` of it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.moto_server import _REMOVED_AWS_ENV, DUMMY_AWS_ENV, make_s3_client, moto_env
from tests.support.processes import die_with_parent

__all__ = [
    "CONDITIONAL_S3_SERVERS",
    "S3rver",
    "conditional_s3_endpoint",
    "make_bucket",
    "ministack_endpoint",
    "s3rver_server",
    "shared_client",
]

REPO = Path(__file__).resolve().parents[2]
MINISTACK_BIN = REPO / ".venv-ministack" / "bin" / "ministack"
MINISTACK_TARGET = "make .venv-ministack/.installed"
S3RVER_BIN = REPO / "tests" / "support" / "s3rver" / "node_modules" / ".bin" / "s3rver"
S3RVER_TARGET = "make tests/support/s3rver/node_modules/.installed"
S3RVER_BUCKET = "embedline-s3rver"
S3RVER_KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
#: Servers whose conditional creates the suite checks embedline against (fixture names
#: ``{name}_endpoint``).
CONDITIONAL_S3_SERVERS = ("moto", "ministack")
_START_TIMEOUT_S = 60.0


def _binary(default: Path, variable: str, target: str) -> str:
    path = os.environ.get(variable) or str(default)
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} is missing: run `{target}` (`make test` does it), or set {variable}",
            pytrace=False,
        )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(argv: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server on a free loopback port (``{port}`` in ``argv``/``env`` values);
    return it and its endpoint once the port accepts connections (three tries, in case
    another process took the port first), or fail the test with the server's log."""
    for _ in range(3):  # another process may take the free port before the server does
        port = _free_port()
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [a.format(port=port) for a in argv],
                env={k: v.format(port=port) for k, v in env.items()},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        endpoint = f"http://127.0.0.1:{port}"
        if _wait_ready(proc, port):
            return proc, endpoint
        _stop(proc)
    tail = log.read_text(errors="replace")[-1500:]
    pytest.fail(
        f"{argv[0]} did not start on 127.0.0.1 within {_START_TIMEOUT_S:.0f} s:\n{tail}",
        pytrace=False,
    )


def _wait_ready(proc: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(extra)
    return env


@contextlib.contextmanager
def _running(
    name: str, argv: Callable[[Path], list[str]], env: Callable[[Path], dict[str, str]]
) -> Iterator[str]:
    """Start server ``name`` with a temporary home (``argv(home)``, ``env(home)``: see
    ``_start``); yield its endpoint; stop it and remove the home."""
    home = Path(tempfile.mkdtemp(prefix=f"embedline-test-{name}-"))
    try:
        proc, endpoint = _start(argv(home), env(home), home / f"{name}.log")
        try:
            yield endpoint
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def ministack_endpoint() -> Iterator[str]:
    """Session-wide ministack S3 server on loopback; yields ``http://127.0.0.1:PORT``."""
    binary = _binary(MINISTACK_BIN, "EMBEDLINE_MINISTACK", MINISTACK_TARGET)
    with pytest.MonkeyPatch.context() as mp:
        for name in _REMOVED_AWS_ENV:
            mp.delenv(name, raising=False)
        for name, value in DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        with _running(
            "ministack",
            lambda home: [binary],
            lambda home: _clean_env(
                BIND_HOST="127.0.0.1",
                GATEWAY_PORT="{port}",
                SERVICES="s3",
                LOG_LEVEL="WARNING",
                S3_PERSIST="0",
                TMPDIR=str(home),
                S3_DATA_DIR=str(home / "s3"),
            ),
        ) as endpoint:
            yield endpoint


@dataclass(frozen=True)
class S3rver:
    """A running s3rver: ``endpoint``, the ``bucket`` it was started with, ``env()`` for a
    child process (its keys, no other ``AWS_*`` variable)."""

    endpoint: str
    bucket: str

    def client(self) -> Any:
        """A boto3 S3 client for this server with its keys."""
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=DUMMY_AWS_ENV["AWS_DEFAULT_REGION"],
            aws_access_key_id=S3RVER_KEYS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3RVER_KEYS["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=None,
        )

    def env(self) -> dict[str, str]:
        """Environment for a CLI under test: ``moto_env`` with s3rver's keys."""
        env = moto_env(self.endpoint)
        env.pop("AWS_SESSION_TOKEN", None)
        env.update(S3RVER_KEYS)
        return env


@pytest.fixture(scope="session")
def s3rver_server() -> Iterator[S3rver]:
    """Session-wide s3rver (npm) on loopback, one bucket configured; data in a temp dir."""
    binary = _binary(S3RVER_BIN, "EMBEDLINE_S3RVER", S3RVER_TARGET)

    def argv(home: Path) -> list[str]:
        (home / "data").mkdir()
        return [
            binary,
            "-a",
            "127.0.0.1",
            "-p",
            "{port}",
            "-d",
            str(home / "data"),
            "--configure-bucket",
            S3RVER_BUCKET,
            "--silent",
        ]

    with _running("s3rver", argv, lambda home: _clean_env()) as endpoint:
        yield S3rver(endpoint, S3RVER_BUCKET)


@pytest.fixture(params=CONDITIONAL_S3_SERVERS)
def conditional_s3_endpoint(request: pytest.FixtureRequest) -> str:
    """The endpoint of moto, then of ministack: servers that refuse a second create."""
    return str(request.getfixturevalue(f"{request.param}_endpoint"))


@functools.cache
def shared_client(endpoint: str) -> Any:
    """One boto3 S3 client per endpoint for the session (clients are thread-safe, and
    building one costs about 0.3 s of CPU); never close it."""
    return make_s3_client(endpoint)


def make_bucket(endpoint: str) -> str:
    """Create and return a fresh bucket ``embedline-test-{12 hex}`` at ``endpoint``."""
    name = f"embedline-test-{uuid.uuid4().hex[:12]}"
    shared_client(endpoint).create_bucket(Bucket=name)
    return name
