"""A subprocess whose wall clock is shifted (libfaketime, Debian ``faketime``, installed by
``tests/support/faketime/install.sh``, which ``make test`` runs): file times stay the
filesystem's (``NO_FAKE_STAT``), monotonic clocks stay real, so only what a host with a wrong
clock would get wrong is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fixtures import REPO

__all__ = ["libfaketime", "shifted_clock"]

_INSTALL = REPO / "tests/support/faketime/install.sh"
_SLEEP_SHIM = REPO / "tests/support/faketime"  # its sitecustomize: time.sleep that works


def libfaketime() -> str:
    """The path of ``libfaketime.so.1``; fails the test, naming the installer, without it."""
    for lib in sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")):
        return str(lib)
    pytest.fail(f"libfaketime is not installed: run {_INSTALL} (make test does)")


def shifted_clock(offset: str, *path: Path) -> dict[str, str]:
    """Variables that shift a subprocess's clock by ``offset`` (``+20m``, ``-2h``).
    ``PYTHONPATH``: the sleep shim first (libfaketime with real monotonic clocks fails every
    ``time.sleep`` with EINVAL; ``tests/support/faketime/sitecustomize.py`` sleeps through
    ``select``), then ``path``, then the repository."""
    return {
        "PYTHONPATH": ":".join(str(p) for p in (_SLEEP_SHIM, *path, REPO)),
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": offset,
        "NO_FAKE_STAT": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
