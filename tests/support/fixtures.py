"""Shared pytest fixtures: a fake embeddings server per test, CLI runner helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.support.cli_zygote import zygote
from tests.support.fake_openai import FakeEmbeddingServer

__all__ = ["REPO", "fake_openai", "run_cli"]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_openai() -> Iterator[FakeEmbeddingServer]:
    """A fresh OpenAI-compatible server on 127.0.0.1 (384 dims), stopped after the test."""
    with FakeEmbeddingServer() as server:
        yield server


def run_cli(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``embedline ARGS`` as a process of its own in ``cwd``; return its result (text).

    The process is forked from this pytest process's CLI fork server
    (``tests/support/cli_zygote.py``: the same process but for third-party libraries
    imported once), or is a fresh interpreter where the environment asks for one."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    server = zygote()
    if server is not None and server.forkable(full_env):
        return server.run(list(args), cwd=cwd, env=full_env, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
