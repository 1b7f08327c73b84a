"""A fork server for ``run_cli``: each ``embedline`` command a test runs is a process of its
own, forked from one that imported the CLI's third-party libraries once.

Why: the suite runs several hundred ``embedline`` commands, and a fresh interpreter spends
about 0.9 CPU s of its 2-3 importing numpy, pandas, pyarrow, boto3, httpx and pydantic
before embedline's first line runs (``-X importtime``), 0.5-0.8 more importing Prefect and
0.3 importing embedline's flows; on CI's two cores that is minutes.

What the forked child shares with ``python -m cli``: its own pid, exit status (a signal's
too), working directory, environment (exactly the test's), ``sys.argv`` and ``sys.path`` as
``-m`` sets them, stdout and stderr captured whole, stdin empty, and the interpreter's own
ending (``atexit``, non-daemon threads joined, an uncaught ``KeyboardInterrupt`` ending by
SIGINT). What it does not: only the libraries in ``PRELOAD`` and embedline's flows
(``PRELOAD_PROJECT``) are imported here, none of which reads the environment or keeps a
value of its process at import but Prefect, which a command that talks to Prefect has read
its settings again once the command has exported its own
(``cli.prefect_env.reread_prefect_settings``), so the child runs on the test's settings. The
CLI package and everything else is imported in the child. A test of what a command imports,
of the interpreter's start, or of a command started beside others (signals to a process
group) starts its own process (``subprocess``/``Popen``), not this.

``EMBEDLINE_TEST_FRESH_CLI=1`` turns it off: every ``run_cli`` a fresh interpreter.
The server ends with the pytest process that started it (its stdin closes).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Zygote", "zygote"]

PRELOAD = (
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.csv",
    "pyarrow.parquet",
    "httpx",
    "boto3",
    "botocore.client",
    "pydantic",
    "pydantic_settings",
    "rich.console",
    "anyio",
    "yaml",
    "tenacity",
    # what Prefect's client imports of other packages (``-X importtime`` of a run: about 0.3
    # CPU s of a small run's 2), not Prefect itself, which reads its settings at import.
    # coolname (flow run names) draws from ``random``, which a forked child reseeds
    "coolname",
    "fastapi",
    "fastapi.encoders",
    "httpcore",
    "h2.connection",
    "griffe",
    "jsonschema",
    "websockets.asyncio.client",
    "websockets.client",
    "fsspec",
    "opentelemetry.trace",
    "pendulum",
    "pathspec",
    "graphviz",
    "humanize",
    "cachetools",
    "sqlite3",
    "prometheus_client",
    "cloudpickle",
    "jinja2",
    # Prefect and the parts of it a run imports (about 0.5-0.8 CPU s a command). Prefect
    # reads its settings and configures its logging at import; a command that talks to
    # Prefect has it read them again once it has exported its own
    # (``cli.prefect_env.reread_prefect_settings``), as it would for a notebook that
    # imported Prefect first. Not prefect_dask: Dask reads its config at import.
    "prefect",
    "prefect.main",
    "prefect.artifacts",
    "prefect.cache_policies",
    "prefect.client.orchestration",
    "prefect.client.schemas.actions",
    "prefect.client.schemas.objects",
    "prefect.client.schemas.schedules",
    "prefect.events",
    "prefect.events.worker",
    "prefect.exceptions",
    "prefect.flow_engine",
    "prefect.futures",
    "prefect.logging.handlers",
    "prefect.runtime",
    "prefect.states",
    "prefect.task_engine",
    "prefect.task_runners",
    "prefect.utilities.annotations",
    "prefect.variables",
)

#: embedline's flows, and what they import of embedline (about 0.3 CPU s a command): no module
#: of the shipped packages reads the environment or keeps a value of its process at import
#: (``tests/unit/test_module_state.py``). Not ``cli``: a child imports it itself, from its
#: working directory first, as ``python -m cli`` does.
PRELOAD_PROJECT = ("flows.embed_csv", "flows.load")

#: Environment variables read when an interpreter or a preloaded library starts.
_READ_AT_START = (
    *("PYTHON", "LD_", "LC_", "LANG", "TZ"),
    *("FAKETIME", "MALLOC_", "ARROW_", "OPENBLAS", "OMP_"),
    *("FSSPEC_", "OTEL_", "WEBSOCKETS_", "PENDULUM_", "PROMETHEUS_"),
)

#: The project's top-level packages: never left imported here.
_PROJECT_PACKAGES = ("adapters", "cli", "deployments", "embedline", "flows", "tasks")

#: Modules the ``site`` module imports from the path as an interpreter starts.
_STARTUP_HOOKS = ("sitecustomize.py", "usercustomize.py")


# ── the client, in the test process ────────────────────────────────────────────────────────


@dataclass
class _Call:
    done: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    pid: int | None = None
    status: int | None = None


class Zygote:
    """The fork server's client: ``run`` has the server fork a child that runs
    ``python -m cli ARGS``, and waits for its exit status. Thread-safe."""

    def __init__(self) -> None:
        env = dict(os.environ)
        # requests go over a socket, which carries a started child's stdout and stderr
        # (SCM_RIGHTS); stdin stays the server's lifeline
        self._requests, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.cli_zygote", str(theirs.fileno())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._next = 0
        self._env = env
        self._tmp = Path(tempfile.mkdtemp(prefix="embedline-cli-zygote-"))
        self._outputs = itertools.count()
        ready = self._proc.stdout.readline() if self._proc.stdout else b""
        if json.loads(ready or b"{}").get("ready") is not True:
            raise RuntimeError(f"the CLI fork server did not start: {ready!r}")
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.close)

    def close(self) -> None:
        """End the server (it ends when its stdin closes) and wait for it: none outlives
        the pytest process, and its children's CPU time is counted in this process's. Its
        directory of outputs goes too."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        self._requests.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            reply = json.loads(line)
            call = self._calls.get(reply["id"])
            if call is None:  # its caller gave up (timeout)
                continue
            if "pid" in reply:
                call.pid = reply["pid"]
                call.started.set()
            else:
                call.status = reply["status"]
                call.done.set()
                self._calls.pop(reply["id"], None)

    def forkable(self, env: Mapping[str, str]) -> bool:
        """Whether a child forked here starts as a fresh interpreter would under ``env``:
        every variable the interpreter or a preloaded library reads at start (``PYTHON*``
        but the path, locale, ``LD_*``, allocators, libfaketime) equals the server's, and no
        directory of ``PYTHONPATH`` holds a module the interpreter runs as it starts (a
        test's ``sitecustomize``: ``tests/support/signal_at``, ``faketime``)."""
        names = {k for k in (*env, *self._env) if k.startswith(_READ_AT_START)}
        names -= {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE"}
        if any(env.get(k) != self._env.get(k) for k in names):
            return False
        path = [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        return not any((p / hook).exists() for p in path for hook in _STARTUP_HOOKS)

    def run(
        self, argv: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """``python -m cli ARGV`` in ``cwd`` with exactly ``env``; its output (text) and
        return code as ``subprocess.run`` gives them. Raises ``subprocess.TimeoutExpired``
        after ``timeout`` seconds (the child killed)."""
        stem = self._tmp / str(next(self._outputs))
        out, err = stem.with_suffix(".out"), stem.with_suffix(".err")
        with open(out, "wb") as out_file, open(err, "wb") as err_file:
            ident, call = self._send(argv, cwd, env, (out_file.fileno(), err_file.fileno()))
        try:
            if not call.done.wait(timeout):
                if call.pid is not None:
                    os.kill(call.pid, signal.SIGKILL)
                call.done.wait(30)
                raise subprocess.TimeoutExpired(
                    [sys.executable, "-m", "cli", *argv], timeout, _text(out), _text(err)
                )
            assert call.status is not None
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "cli", *argv], call.status, _text(out), _text(err)
            )
        finally:
            self._calls.pop(ident, None)
            for path in (out, err):
                path.unlink(missing_ok=True)

    def start(
        self,
        argv: list[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdout: int,
        stderr: int,
        new_session: bool = False,
    ) -> tuple[int, _Call]:
        """Fork ``python -m cli ARGV`` writing to the descriptors ``stdout`` and ``stderr``
        (this process's to close), in a session of its own when ``new_session``, and return
        its pid and the call that gets its exit status (``tests.support.forked_cli``)."""
        _, call = self._send(argv, cwd, env, (stdout, stderr), new_session=new_session)
        if not call.started.wait(60) or call.pid is None:
            raise RuntimeError(f"the CLI fork server did not start {argv!r}")
        return call.pid, call

    def _send(
        self,
        argv: list[str],
        cwd: Path,
        env: Mapping[str, str],
        fds: tuple[int, int],
        *,
        new_session: bool = False,
    ) -> tuple[int, _Call]:
        with self._lock:
            self._next += 1
            ident = self._next
            call = self._calls[ident] = _Call()
            request = {"id": ident, "argv": argv, "cwd": str(cwd), "env": dict(env)}
            request["session"] = new_session
            socket.send_fds(self._requests, [json.dumps(request).encode()], list(fds))
        return ident, call


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace").replace("\r\n", "\n")
    except FileNotFoundError:
        return ""


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def zygote() -> Zygote | None:
    """This process's fork server (started on first use), or None when turned off."""
    global _zygote
    if os.environ.get("EMBEDLINE_TEST_FRESH_CLI") == "1":
        return None
    with _zygote_lock:
        if _zygote is None or _zygote._proc.poll() is not None:
            _zygote = Zygote()
        return _zygote


# ── the server ─────────────────────────────────────────────────────────────────────────────


def _serve(requests: socket.socket) -> dict[str, Any] | None:
    """Answer ``requests`` until stdin closes (None) or, in a forked child, return its
    request (its ``fds``: the child's stdout and stderr)."""
    import importlib

    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # as the CLI's entry does
    _export_the_clis_prefect_settings()
    for name in (*PRELOAD, *PRELOAD_PROJECT):
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of the suite is the tests' to handle
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    reply.write(json.dumps({"ready": True}) + "\n")
    children: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([0, requests.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children, reply)
        if 0 in ready and not os.read(0, 4096):
            return None  # the client closed our stdin: it ended
        if requests.fileno() in ready:
            data, fds, _flags, _addr = socket.recv_fds(requests, 1 << 20, 2)
            if not data:
                return None
            request = {**json.loads(data), "fds": fds}
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for fd in (wake_r, wake_w, requests.fileno(), reply.fileno()):
                    os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            children[pid] = request["id"]
            reply.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
        _reap(children, reply)


def _export_the_clis_prefect_settings() -> None:
    """Export the Prefect settings a command exports (``configure_prefect_environment``), so
    that Prefect is imported under them and most children find its logging configured as
    they would (``reread_prefect_settings`` compares). The project's modules this imports
    are dropped again: a child imports them itself (from its working directory first)."""
    before = set(sys.modules)
    from cli.prefect_env import configure_prefect_environment

    configure_prefect_environment()
    for name in set(sys.modules) - before:
        if name.partition(".")[0] in _PROJECT_PACKAGES:
            del sys.modules[name]


def _die_with_the_server() -> None:
    """SIGTERM when this server dies (prctl(2) ``PR_SET_PDEATHSIG``), as a test's
    ``die_with_parent`` child gets when the test process dies: the server ends with it."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _reap(children: dict[int, int], reply: Any) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = children.pop(pid, None)
        if ident is not None:
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            reply.write(json.dumps({"id": ident, "status": code}) + "\n")


def _become(request: dict[str, Any], base_path: list[str]) -> None:
    """In the forked child: the process ``python -m cli ARGV`` would have been."""
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["session"]:
        os.setsid()
    _die_with_the_server()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out, err = request["fds"]
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *base_path]
    sys.argv = ["-m", *request["argv"]]


if __name__ == "__main__":
    _own = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    _base = [p for p in sys.path[1:] if p and p not in _own]
    _request = _serve(socket.socket(fileno=int(sys.argv[1])))
    if _request is not None:
        _become(_request, _base)
        del _request, _base
        import runpy

        runpy.run_module("cli", run_name="__main__", alter_sys=True)
