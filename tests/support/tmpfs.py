"""A real tiny filesystem for "disk full" tests: a tmpfs mounted for one test (root, which
this machine and CI have), and a filler that takes every free block of it."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["fill", "tiny_tmpfs"]


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at ``tmp_path / "tiny"``, unmounted after the test."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write ``directory / ".filler"`` until the filesystem refuses (ENOSPC); return it.
    Deleting it frees the space again."""
    path = directory / ".filler"
    block = b"\xa5" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\xa5"):  # the last partial block
                        pass
                return path
    finally:
        os.close(fd)
