"""The tests' CLI fork server (``tests/support/cli_zygote.py``) gives what a fresh ``python -m
cli`` gives: output, exit code, the environment and directory asked for, a signal's death,
and a fresh interpreter wherever the environment is one a fork cannot give."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_zygote import Zygote
from tests.support.fixtures import REPO


@pytest.fixture(scope="module")
def server() -> Zygote:
    return Zygote()


def _fresh(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["run", "missing.csv"],
        ["run", "in.csv", "--chunk-size", "0"],
        ["status", "--ledger", "nowhere/ledger.sqlite3"],
        ["run", "in.csv", "--dry-run"],
    ],
    ids=["help", "missing-input", "bad-option", "status", "dry-run"],
)
def test_a_forked_command_prints_and_exits_as_a_fresh_one(
    server: Zygote, tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "in.csv").write_text("id,text\na,one\nb,two\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    forked = server.run(args, cwd=tmp_path, env=env, timeout=120)
    fresh = _fresh(args, tmp_path, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )


def test_the_child_has_the_callers_environment_directory_and_path(
    server: Zygote, tmp_path: Path
) -> None:
    (tmp_path / "cli").mkdir()  # a package named like the CLI in cwd: -m finds cwd's first
    (tmp_path / "cli" / "__init__.py").write_text("")
    probe = "import os, sys; print(os.getcwd(), os.environ.get('PROBE'), sys.path[0])"
    (tmp_path / "cli" / "__main__.py").write_text(f"{probe}\nraise SystemExit(7)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROBE": "seen"}
    forked = server.run([], cwd=tmp_path, env=env, timeout=60)
    assert forked.returncode == 7
    assert forked.stdout.split() == [str(tmp_path), "seen", str(tmp_path)]
    assert "PROBE" not in os.environ


def test_a_signal_a_child_dies_of_is_its_return_code_and_a_timeout_kills_it(
    server: Zygote, tmp_path: Path
) -> None:
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__init__.py").write_text("")
    (tmp_path / "cli" / "__main__.py").write_text(
        "import os, signal, sys, time\n"
        "if sys.argv[1:] == ['int']:\n    raise KeyboardInterrupt\n"
        "if sys.argv[1:] == ['kill']:\n    os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert server.run(["kill"], cwd=tmp_path, env=env, timeout=60).returncode == -15
    interrupted = server.run(["int"], cwd=tmp_path, env=env, timeout=60)
    assert interrupted.returncode == -2 and "KeyboardInterrupt" in interrupted.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(["sleep"], cwd=tmp_path, env=env, timeout=1)


def test_an_environment_read_at_interpreter_start_gets_a_fresh_interpreter(
    server: Zygote,
) -> None:
    assert server.forkable({**os.environ, "PYTHONPATH": "/elsewhere", "AWS_REGION": "x"})
    for name, value in (("LD_PRELOAD", "libfaketime.so.1"), ("PYTHONIOENCODING", "ascii")):
        assert not server.forkable({**os.environ, name: value})
    hooked = REPO / "tests" / "support" / "signal_at"  # a sitecustomize runs at start
    assert (hooked / "sitecustomize.py").exists()
    assert not server.forkable({**os.environ, "PYTHONPATH": f"{hooked}{os.pathsep}{REPO}"})


def test_a_closed_server_has_ended_and_left_no_directory(tmp_path: Path) -> None:
    own = Zygote()
    (tmp_path / "in.csv").write_text("id,text\na,one\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert own.run(["--help"], cwd=tmp_path, env=env, timeout=120).returncode == 0
    outputs = own._tmp
    assert outputs.is_dir()
    own.close()
    assert own._proc.poll() is not None
    assert not outputs.exists()


_SLOW_CLI = """import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("to stderr", file=sys.stderr, flush=True)
print("started", flush=True)
time.sleep(60)
"""


def test_popen_cli_gives_a_forked_command_popens_pipes_signals_and_session(
    tmp_path: Path,
) -> None:
    """``popen_cli`` forks the command (not a fresh interpreter: its command line is the
    fork server's) and gives what the tests use of ``Popen``: live pipes, a signal, the
    exit status, a session of its own, stderr into stdout."""
    import signal

    import psutil

    from tests.support.forked_cli import ForkedCli, popen_cli, run_cli_process

    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__init__.py").write_text("")
    (tmp_path / "cli" / "__main__.py").write_text(_SLOW_CLI)
    command = [sys.executable, "-m", "cli", "run"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = popen_cli(
        command,
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert isinstance(proc, ForkedCli)
    assert "cli_zygote" in " ".join(psutil.Process(proc.pid).cmdline())
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    assert os.getsid(proc.pid) == proc.pid and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (7, "", "to stderr\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli_process(command, cwd=tmp_path, env=env, capture_output=True, timeout=1)
    merged = popen_cli(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert merged.stdout is not None
    assert merged.stdout.readline() + merged.stdout.readline() == b"to stderr\nstarted\n"
    assert os.getsid(merged.pid) != merged.pid  # no start_new_session: the server's
    merged.kill()
    assert merged.wait(30) == -signal.SIGKILL
