"""The CLI's own temporary Prefect server: started early, reachable by Dask workers, and
never outliving the command.

Prefect 3.9 starts a temporary server itself when no ``PREFECT_API_URL`` is set
(``prefect.server.api.server.SubprocessASGIServer``), but only once the flow is called, as a
plain child that a ``kill -9`` of the CLI leaves running forever (about 200 MB and a port
each), and that Dask worker processes cannot find (each tried to start its own). Instead the
CLI starts the same uvicorn app (same environment as Prefect's: ephemeral services, no UI)
at once, in parallel with planning, and exports its URL as ``PREFECT_API_URL`` so the flow,
its tasks and any Dask worker spawned by the flow talk to this one server.

The server process ends when the CLI does, however the CLI ended:

- normal end, error or second Ctrl-C: ``stop()`` (SIGTERM, then SIGKILL after 5 s);
- ``kill -9`` of the CLI or of its whole process group (the server has a session of its
  own, so a terminal's Ctrl-C reaches only the CLI): the server watches a pipe whose only
  write end the CLI holds; the kernel closes it when the CLI dies, the server reads EOF and
  exits (at most ``_EXIT_GRACE_S`` later). ``PR_SET_PDEATHSIG`` (Linux prctl(2)) is set as
  well, when available.

Several CLIs started at once on one ``PREFECT_HOME`` (a shell loop, a cron minute, a fresh
container) start one server each on one SQLite database. Prefect migrates a new database at
start, and two servers migrating it at once fail (``duplicate column name``). Each server
therefore starts under an exclusive lock on ``$PREFECT_HOME/embedline-temporary-server.lock``
(flock(2)) and lets it go once its own ``/api/health`` answers: start-ups take turns, the
servers then run side by side. The kernel drops the lock when a server dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from cli.lifeline import set_parent_death_signal

__all__ = ["LocalServer", "ServerStartError"]

#: Block types are for the UI's block forms, which this server does not serve; registering
#: them (or hashing them to skip it) imported every installed Prefect collection at start
#: (prefect-dask: dask, distributed, numpy), 0.4 s of the server's 4-5 s start here. A
#: ``prefect server start`` on the same PREFECT_HOME still registers them itself.
_SKIP_BLOCK_REGISTRATION = {
    "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
    "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
}
_EXIT_GRACE_S = 3.0  # seconds a server whose CLI died gets to shut down before _exit


class ServerStartError(RuntimeError):
    """The temporary Prefect server did not answer ``/api/health`` (message: one line)."""


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")


def _log_path() -> Path:
    return _home() / "embedline-temporary-server.log"


class LocalServer:
    """A Prefect API server subprocess on 127.0.0.1 tied to this process's lifetime.

    ``start()`` returns at once (the server imports for several seconds); ``wait_ready``
    blocks until ``/api/health`` answers 200. ``api_url`` is ``http://127.0.0.1:PORT/api``.
    The server's output goes to ``$PREFECT_HOME/embedline-temporary-server.log``.
    """

    def __init__(self) -> None:
        self.port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.log_path = _log_path()
        self.process: subprocess.Popen[bytes] | None = None
        self._write_fd: int | None = None
        self.ready = False  # its health check answered once (``wait_ready``)

    def start(self) -> LocalServer:
        """Spawn the server (call from the main thread: PR_SET_PDEATHSIG is per thread).

        :raises OSError: ``PREFECT_HOME`` (its log file's directory) cannot be written.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, self._write_fd = os.pipe()  # both ends close-on-exec: only read_fd passed
        env = {
            **_SKIP_BLOCK_REGISTRATION,
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }  # what Prefect's own temporary server gets
        env.pop("PREFECT_API_URL", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cli.local_server",
                    str(self.port),
                    str(read_fd),
                    str(os.getpid()),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(read_fd,),
                start_new_session=True,
            )
        os.close(read_fd)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the server is healthy.

        :raises ServerStartError: it exited, or did not answer within ``timeout_s`` seconds.
        """
        import httpx

        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServerStartError(
                        f"the temporary Prefect server exited with code "
                        f"{self.process.returncode}; see {self.log_path}"
                    )
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        self.ready = True
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise ServerStartError(
            f"the temporary Prefect server did not start within {timeout_s:.0f} s (see "
            f"{self.log_path}); start one with `prefect server start` and set PREFECT_API_URL"
        )

    @property
    def started(self) -> bool:
        """True once ``start`` spawned the process."""
        return self.process is not None

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s`` seconds) and reap it."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """Stop the server at once (a hard exit); never raises."""
        with contextlib.suppress(OSError):
            if self.process is not None and self.process.poll() is None:
                self.process.kill()


def _exit_when_parent_dies(watch_fd: int) -> None:
    """In the server: a read of the pipe returns EOF once the CLI holds no write end."""
    try:
        while os.read(watch_fd, 4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown
    time.sleep(_EXIT_GRACE_S)
    os._exit(0)


def _take_start_lock() -> int:
    """In the server: block until no other temporary server of this ``PREFECT_HOME`` is
    starting; return the locked file's descriptor (see the module docstring)."""
    fd = os.open(_home() / "embedline-temporary-server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _release_when_healthy(lock_fd: int, port: int) -> None:
    """In the server: let the next server start once this one answers ``/api/health``
    (its database is migrated by then: Prefect migrates before it serves)."""
    import httpx

    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                if client.get(f"http://127.0.0.1:{port}/api/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    os.close(lock_fd)


def _serve(port: int, watch_fd: int, parent_pid: int) -> None:
    set_parent_death_signal(parent_pid)
    threading.Thread(target=_exit_when_parent_dies, args=(watch_fd,), daemon=True).start()
    lock_fd = _take_start_lock()
    threading.Thread(target=_release_when_healthy, args=(lock_fd, port), daemon=True).start()
    import uvicorn

    uvicorn.run(
        "prefect.server.api.server:create_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="on",
    )


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
