"""``popen_cli`` and ``run_cli_process``: ``subprocess.Popen`` and ``subprocess.run`` of
``[sys.executable, "-m", "cli", ...]``, with the process forked from the CLI fork server
(``tests/support/cli_zygote.py``) instead of started as a fresh interpreter.

Tests that signal, kill or watch a command while it runs need a ``Popen``; a fresh
interpreter costs about 1.2 CPU s of imports before the command's first line, and the suite
starts a few hundred of them. The object returned keeps ``Popen``'s contract where these
tests use it: ``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``communicate``,
``send_signal``/``terminate``/``kill``, ``stdout``/``stderr`` pipes (text or bytes), a
session of its own (``start_new_session``), use as a context manager. Anything else asked
(``stdin``, a ``preexec_fn`` other than ``die_with_parent``, an environment a fork cannot
give: ``Zygote.forkable``) gets a real ``subprocess.Popen``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from tests.support.cli_zygote import _Call, zygote
from tests.support.processes import die_with_parent

__all__ = ["ForkedCli", "popen_cli", "run_cli_process"]

_ACCEPTED = {"cwd", "env", "text", "stdout", "stderr", "start_new_session", "preexec_fn"}
_ACCEPTED |= {"encoding", "errors", "universal_newlines", "bufsize", "close_fds"}


class ForkedCli:
    """A command forked by the fork server, as ``subprocess.Popen`` shows a child."""

    def __init__(
        self,
        args: list[str],
        pid: int,
        call: _Call,
        stdout: IO[Any] | None,
        stderr: IO[Any] | None,
    ) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = stdout
        self.stderr = stderr
        self.stdin = None
        self._call = call

    def poll(self) -> int | None:
        """The exit status once the fork server reaped the command, else None."""
        if self.returncode is None and self._call.done.is_set():
            self.returncode = self._call.status
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait ``timeout`` seconds (None: forever) for the exit status.

        :raises subprocess.TimeoutExpired: still running after ``timeout``."""
        if not self._call.done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        code = self.poll()
        assert code is not None
        return code

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Read both pipes to their end and wait; ``(stdout, stderr)`` (None for one not a
        pipe). :raises subprocess.TimeoutExpired: not ended within ``timeout`` seconds."""
        assert input is None, "a forked command's stdin is /dev/null"
        found: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=name, s=stream: found.__setitem__(n, s.read()))
            for name, stream in (("out", self.stdout), ("err", self.stderr))
            if stream is not None and not stream.closed
        ]
        for reader in readers:
            reader.daemon = True
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return found.get("out"), found.get("err")

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` unless the command has been reaped (its pid may be another's)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ForkedCli:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def popen_cli(args: list[str], **kwargs: Any) -> ForkedCli | subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)`` for ``args`` = ``[sys.executable, "-m", "cli",
    ...]``, forked by the fork server where it can give the same process (module
    docstring), else that ``Popen``."""
    env = dict(kwargs.get("env") or os.environ)
    server = zygote()
    if (
        list(args[:3]) != [sys.executable, "-m", "cli"]
        or set(kwargs) - _ACCEPTED
        or kwargs.get("preexec_fn") not in (None, die_with_parent)
        or server is None
        or not server.forkable(env)
    ):
        return subprocess.Popen(args, **kwargs)
    text = bool(kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding"))
    ours: list[IO[Any] | None] = []
    theirs: list[int] = []
    for name in ("stdout", "stderr"):
        target = kwargs.get(name)
        if target == subprocess.PIPE:
            read, write = os.pipe()
            ours.append(_reader(read, text, kwargs))
            theirs.append(write)
        elif target == subprocess.STDOUT:
            ours.append(None)
            theirs.append(os.dup(theirs[0]))
        elif target == subprocess.DEVNULL:
            ours.append(None)
            theirs.append(os.open(os.devnull, os.O_WRONLY))
        else:  # None (this process's) or a file
            ours.append(None)
            theirs.append(os.dup(target.fileno() if target is not None else (1, 2)[len(theirs)]))
    try:
        pid, call = server.start(
            list(args[3:]),
            cwd=Path(kwargs.get("cwd") or os.getcwd()),
            env=env,
            stdout=theirs[0],
            stderr=theirs[1],
            new_session=bool(kwargs.get("start_new_session")),
        )
    finally:
        for fd in theirs:
            os.close(fd)
    return ForkedCli(list(args), pid, call, ours[0], ours[1])


def _reader(fd: int, text: bool, kwargs: Mapping[str, Any]) -> IO[Any]:
    raw = os.fdopen(fd, "rb")
    if not text:
        return raw
    return io.TextIOWrapper(raw, encoding=kwargs.get("encoding"), errors=kwargs.get("errors"))


def run_cli_process(
    args: list[str], *, timeout: float | None = None, capture_output: bool = False, **kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, ...)`` through ``popen_cli``: the output read whole, the
    command killed after ``timeout`` seconds (``subprocess.TimeoutExpired``)."""
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with popen_cli(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)
