"""What an operator sees when things go wrong: one line, the right exit code, checks done
before Prefect starts, quiet broken pipes, a truthful status, help with defaults."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.ledger import Ledger
from embedline.models import ChunkSpec, DeadLetter, InputPlan, InputSource
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.forked_cli import popen_cli, run_cli_process
from tests.support.prefect_home import fresh_prefect_home

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_NO_CREDENTIALS = {
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    if extra.get("AWS_CONFIG_FILE") == "/nonexistent":
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(fresh_prefect_home(home)), **extra)
    return env


def _cli(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli_process(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env=_env(tmp_path / "prefect-home", **extra),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _prefect_started(tmp_path: Path) -> bool:
    """The CLI's temporary server writes its log as it spawns (the CLI never lets Prefect
    start a server of its own; the home's database is a copy made before the command)."""
    return (tmp_path / "prefect-home" / "embedline-temporary-server.log").exists()


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.fixture
def csv_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.csv"
    path.write_text("id,text\n1,alpha\n2,beta\n")
    return path


# -- item 2: a configured Prefect API that does not answer -----------------------------------


def test_unreachable_prefect_api_is_one_line_and_exit_2(tmp_path: Path, csv_file: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/api"
    result = _cli(tmp_path, "run", "in.csv", PREFECT_API_URL=url)
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert url in line and "unset PREFECT_API_URL" in line and "prefect server start" in line


class _NotPrefect:
    """A local HTTP server that is not a Prefect API: ``answer`` is ``"404"`` (every path),
    ``"web-page"`` (200, HTML) or ``"json"`` (200, ``{"status": "ok"}``, as the fake
    embeddings server answers any GET)."""

    def __init__(self, answer: str) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                json_body = answer == "json"
                body = b'{"status": "ok"}' if json_body else b"<html><body>an app</body></html>"
                self.send_response(404 if answer == "404" else 200)
                self.send_header(
                    "Content-Type", "application/json" if json_body else "text/html; charset=utf-8"
                )
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("answer", ["404", "web-page", "json"])
def test_a_prefect_api_url_that_is_not_a_prefect_api_is_one_line_and_exit_2(
    tmp_path: Path, csv_file: Path, answer: str
) -> None:
    """Some other web server at PREFECT_API_URL (a wrong port, the UI's URL without /api,
    another API). Before: tracebacks ending "RuntimeError: Failed to reach API at …" (404,
    web page) or "InvalidVersion: Invalid version: {'status': 'ok'}" (JSON), and exit 1."""
    server = _NotPrefect(answer)
    try:
        url = f"{server.url}/{'' if answer == 'web-page' else 'api'}"
        result = _cli(tmp_path, "run", "in.csv", PREFECT_API_URL=url)
    finally:
        server.close()
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert url in line and "not as a Prefect API" in line and "ends in /api" in line, line


@pytest.mark.parametrize(
    ("setting", "value", "problem"),
    [
        ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "10", "greater than or equal to 30"),
        ("PREFECT_API_REQUEST_TIMEOUT", "soon", "a valid number"),
        ("prefect.toml", "[flows]\nheartbeat_frequency = 5\n", "greater than or equal to 30"),
    ],
    ids=["env-range", "env-type", "prefect-toml"],
)
def test_a_setting_prefect_refuses_is_one_line_and_exit_2(
    tmp_path: Path, csv_file: Path, setting: str, value: str, problem: str
) -> None:
    """Prefect validates its settings as it is imported. Before: Prefect's "Failed to
    initialize plugins" report with the value, a 60-line traceback, exit 1."""
    from tests.support.processes import wait_until_gone

    extra = {}
    if setting == "prefect.toml":
        (tmp_path / "prefect.toml").write_text(value)
    else:
        extra[setting] = value
    result = _cli(tmp_path, "run", "in.csv", **extra)
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert line.startswith("embedline: error: Prefect refuses a setting (") and problem in line
    named = "prefect.toml" if setting == "prefect.toml" else setting
    assert named in line and line.endswith(": fix or unset it"), line
    assert f"'{value}'" not in line, line  # the value itself is never shown
    home = tmp_path / "prefect-home"
    assert wait_until_gone("PREFECT_HOME", str(home), 10) == []


# -- item 4: checks that need no Prefect answer before it starts -----------------------------


@pytest.mark.parametrize("run", [None, "0123456789abcdef"], ids=["latest", "named"])
def test_load_with_no_committed_run_is_one_line_before_prefect(
    tmp_path: Path, run: str | None
) -> None:
    result = _cli(tmp_path, "load", *([run] if run else []), "--to", "lancedb://./db")
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert line.startswith("embedline: error: ") and "no committed run" in line, line
    assert not _prefect_started(tmp_path)


@pytest.mark.parametrize("ledger", ["afile/ledger.sqlite3", "afile/deeper/ledger.sqlite3"])
def test_a_ledger_where_a_file_stands_in_the_way_is_one_line_before_prefect(
    tmp_path: Path, csv_file: Path, ledger: str
) -> None:
    """It was the flow's traceback from the run's first scratch directory (break test)."""
    (tmp_path / "afile").write_text("a file where the ledger's directory should be")
    result = _cli(tmp_path, "run", csv_file.name, "--ledger", ledger)
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert line.startswith(f"embedline: error: cannot use the ledger {ledger}: a file stands"), line
    assert "--ledger" in line and not _prefect_started(tmp_path)


def test_rerun_held_back_only_by_dead_letters_answers_without_prefect(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """Every chunk published, one empty text: the rerun has nothing to embed or commit. It
    says so as the flow did (same status line, exit 1) without a flow run (before: one, and
    5 s of waiting for the temporary server per rerun); with --allow-failed-rows it commits."""
    (tmp_path / "in.csv").write_text("id,text\n1,alpha\n2,\n3,gamma\n")
    args = (
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--chunk-size",
        "2",
        "--on-empty-text",
        "fail",
    )
    first = _cli(tmp_path, *args)
    assert first.returncode == 1, first.stderr[-3000:]
    assert "Flow run" in first.stderr
    sent = fake_openai.counters()["requests"]
    rerun = _cli(tmp_path, *args)
    assert rerun.returncode == 1, rerun.stderr[-3000:]

    def status_line(out: str) -> str:
        return next(line for line in out.splitlines() if line.startswith("status "))

    assert status_line(rerun.stdout) == status_line(first.stdout)
    assert "1 row is a dead letter" in status_line(rerun.stdout)
    assert "2 skipped" in rerun.stdout
    assert fake_openai.counters()["requests"] == sent
    assert "Flow run" not in rerun.stderr, rerun.stderr[-3000:]  # no flow ran (nor waited for)
    status = _cli(tmp_path, "status")
    assert "\tdead_letters\t" in status.stdout and "rows=2/3" in status.stdout, status.stdout
    committed = _cli(tmp_path, *args, "--allow-failed-rows")
    assert committed.returncode == 0, committed.stderr[-3000:]
    assert list((tmp_path / "embedline-output" / "manifests").glob("*.json"))
    assert fake_openai.counters()["requests"] == sent and "Flow run" not in committed.stderr
    # The commit's event went to the temporary server the command was stopping: nobody could
    # read it there, and Prefect's events worker waited for it at exit with a stray line
    # ("Still processing items: 1 items remaining...", seconds of the re-export's rerun).
    assert committed.stderr.strip() == "", committed.stderr[-3000:]


def test_output_that_is_a_file_is_refused_before_prefect(tmp_path: Path, csv_file: Path) -> None:
    (tmp_path / "taken").write_text("not a directory")
    result = _cli(tmp_path, "run", "in.csv", "--output", "taken")
    assert result.returncode == 2
    assert "exists and is not a directory" in _one_line(result.stderr)
    assert not _prefect_started(tmp_path)


def test_s3_input_without_credentials_is_one_line_before_prefect(
    tmp_path: Path, moto_endpoint: str
) -> None:
    result = _cli(
        tmp_path,
        "run",
        "s3://no-such-bucket/in.csv",
        AWS_ENDPOINT_URL=moto_endpoint,
        **_NO_CREDENTIALS,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    line = _one_line(result.stderr)
    assert "s3://no-such-bucket/in.csv" in line and "credentials" in line
    assert not _prefect_started(tmp_path)


def test_s3_output_without_credentials_is_one_line_before_prefect(
    tmp_path: Path, csv_file: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    result = _cli(
        tmp_path,
        "run",
        "in.csv",
        "--output",
        f"s3://{s3_bucket}/out",
        AWS_ENDPOINT_URL=moto_endpoint,
        **_NO_CREDENTIALS,
    )
    assert result.returncode in (2, 3), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "credentials" in _one_line(result.stderr)
    assert not _prefect_started(tmp_path)


# -- item 8: OpenAI's API and no key -----------------------------------------------------------


def test_openai_without_a_key_is_refused_with_exit_3(tmp_path: Path, csv_file: Path) -> None:
    result = _cli(tmp_path, "run", "in.csv", "--embedder", "openai")
    assert result.returncode == 3
    assert "EMBEDLINE_API_KEY" in _one_line(result.stderr)
    assert not _prefect_started(tmp_path)


# -- item 7: broken pipes ----------------------------------------------------------------------


def _big_ledger(path: Path) -> str:
    """A ledger with 3,000 runs and one run of 5,000 dead letters: more than a pipe holds."""
    ledger = Ledger(path)
    source = InputSource("/x.csv", "x.csv", "utf-8", "id", "text", 0, 1, 2, 8)
    chunk = ChunkSpec(0, "c" * 64, 1, 2, 5000, 0, 0, "h")
    plan = InputPlan(source, "f" * 64, 100, 5000, (chunk,))
    for i in range(3000):
        ledger.start_run(
            f"{i:064x}",
            plan,
            output_uri="/out",
            settings={},
            flow_run_id=None,
            object_uris=[f"/out/{i}/{chunk.object_key}"],
        )
    run = f"{0:064x}"
    dead = [DeadLetter(1 + i, f"id-{i}", "empty_text") for i in range(5000)]
    ledger.mark_published(
        run, chunk, object_uri=f"/out/0/{chunk.object_key}", sha256="s", rows=0, dead_letters=dead
    )
    ledger.close()
    return run


@pytest.mark.parametrize("command", ["status", "dead-letters"])
def test_output_into_a_closed_pipe_exits_quietly(tmp_path: Path, command: str) -> None:
    run = _big_ledger(tmp_path / "ledger.sqlite3")
    args = [command, "--ledger", "ledger.sqlite3"] + ([run] if command != "status" else [])
    proc = popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env=_env(tmp_path / "prefect-home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # what `| head -1` does: one line, then close
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, err
    assert first and err == b""


# -- item 6: status after a double Ctrl-C -----------------------------------------------------


def test_status_after_a_double_sigint_says_the_run_is_not_running(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t {i}\n" for i in range(60)))
    fake_openai.fail_when(lambda payload: {"delay_s": 0.5})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "run",
            "in.csv",
            "--embedder",
            "openai",
            "--base-url",
            fake_openai.base_url,
            "--output",
            "out",
            "--chunk-size",
            "4",
            "--concurrency",
            "2",
        ],
        cwd=tmp_path,
        env=_env(tmp_path / "prefect-home"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not list((tmp_path / "out").glob("chunks/*.parquet")):
        assert time.monotonic() < deadline and proc.poll() is None, "no chunk was published"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    status = _cli(tmp_path, "status")
    assert status.returncode == 0, status.stderr
    fields = status.stdout.splitlines()[0].split("\t")
    assert fields[1] in ("interrupted", "crashed"), status.stdout
    assert "running=0" in fields[3], status.stdout
    # A second Ctrl-C exits at once, so a chunk whose object landed may not be recorded yet:
    # the ledger never claims more than the store holds, and the rerun adopts the rest unpaid.
    stored = len(list((tmp_path / "out").glob("chunks/*.parquet")))
    recorded = int(fields[3].split("published=")[1].split()[0])
    # At most the dispatch window (--concurrency + 1 = 3 chunk tasks) published unrecorded.
    assert stored - 3 <= recorded <= stored, (status.stdout, stored)
    fake_openai.fail_when(None)
    time.sleep(1.0)  # the killed run's delayed requests finish (and are counted) first
    fake_openai.reset()
    rerun = _cli(
        tmp_path,
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--chunk-size",
        "4",
    )
    assert rerun.returncode == 0, rerun.stderr
    # the rerun pays for what no published chunk and no kept request (tasks/embed/paid.py: the
    # interrupted chunks' answered requests, at most the window's 3 chunks of 4 rows) paid for
    unpaid = 60 - 4 * stored
    assert unpaid - 4 * 3 <= fake_openai.inputs <= unpaid, (fake_openai.inputs, stored)


# -- item 9: help ------------------------------------------------------------------------------


def test_run_help_shows_every_default_and_explains_the_ledger(tmp_path: Path) -> None:
    result = _cli(tmp_path, "run", "--help")
    text = " ".join(result.stdout.split())
    for flag in ("--chunk-size", "--batch-size", "--concurrency", "--timeout", "--grace"):
        assert flag in text
    assert "rows per chunk (default: 1000)" in text and "(default: 60.0)" in text
    assert "rows per request (at most 2048, OpenAI's limit) (default: 1000)" in text
    no_reuse = text.split("--no-reuse ", 1)[1].split(" --task-runner", 1)[0]
    assert "default: True" not in no_reuse and "reused" in no_reuse  # on unless --no-reuse
    # an unset option says what unset means, never argparse's "(default: None)" (which
    # contradicted --auth-header's text), and --no-reuse says it is off
    assert "default: None" not in text and "(default: off: reuse is on)" in no_reuse
    assert "(default: $EMBEDLINE_AUTH_HEADER, else Authorization)" in text
    for flag in (
        "--ledger LEDGER the SQLite ledger",
        "--id-column ID_COLUMN header name",
        "--text-column TEXT_COLUMN header name",
        "--dimensions DIMENSIONS shortened",
        "--on-too-long {dead-letter,truncate} what to do",
    ):
        assert flag in text


def test_status_elsewhere_says_where_the_ledger_is(tmp_path: Path) -> None:
    result = _cli(tmp_path, "status")
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert str(tmp_path / ".embedline/ledger.sqlite3") in line and "--ledger" in line


# -- item 10: wording --------------------------------------------------------------------------


def test_settings_errors_carry_no_pydantic_prefix(tmp_path: Path, csv_file: Path) -> None:
    result = _cli(tmp_path, "run", "in.csv", "--model", "text-embedding-3-small")
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert "Value error" not in line and "--embedder openai" in line


def test_one_dead_letter_is_singular(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> None:
    (tmp_path / "in.csv").write_text("id,text\n1,alpha\n2,\n3,gamma\n")
    result = _cli(
        tmp_path,
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--on-empty-text",
        "fail",
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "1 row is a dead letter (see" in result.stdout
    assert "1 rows" not in result.stdout and "1 dead letters" not in result.stdout
    assert ", 1 dead letter\n" in result.stdout  # the rows line
    committed = _cli(
        tmp_path,
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--allow-failed-rows",
        "--on-empty-text",
        "fail",
    )
    assert committed.returncode == 0, committed.stderr[-2000:]
    assert "1 row is a dead letter (committed with --allow-failed-rows)" in committed.stdout
    assert "1 dead letters" not in committed.stdout


# -- item 3: expected failures have no traceback (unless --debug) ------------------------------


@pytest.mark.parametrize(
    "debug", [False, pytest.param(True, marks=pytest.mark.slow)]
)  # CI's 20-minute budget: make test-all runs it
def test_nothing_listening_at_base_url_stops_the_run_without_traceback(
    tmp_path: Path, debug: bool
) -> None:
    """A wrong --base-url (nothing listens): the first call's retries, then the run stops,
    exit 3, instead of every chunk spending its own retries (before: 39 s and 82 lines for
    the 240-row sample, minutes for a large file)."""
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t {i}\n" for i in range(40)))
    base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    result = _cli(
        tmp_path,
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        base_url,
        "--max-attempts",
        "2",
        "--chunk-size",
        "2",
        "--concurrency",
        "2",
        *(["--debug"] if debug else []),
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert "no request of this run ever reached it" in result.stdout, result.stdout
    assert "api        0 requests" in result.stdout  # refused connections sent nothing
    assert "not sent: an earlier request" not in result.stdout  # the first error, verbatim
    assert "check that the server is running and --base-url is right" in result.stderr
    assert ("Traceback" in result.stderr) is debug, result.stderr[-3000:]
    not_run = int(result.stdout.split(" not run")[0].rsplit(" ", 1)[-1])
    assert not_run >= 10, result.stdout  # 20 chunks: dispatching stopped after the first
    if not debug:
        retries = [line for line in result.stderr.splitlines() if "retry in" in line]
        assert 1 <= len(retries) <= 3  # one per retried request, at most the window's
        # one ERROR line for the chunk that stopped the run, one for the others in flight
        # that failed with the same error (before: two per chunk, Prefect's and ours)
        errors = [line for line in result.stderr.splitlines() if "| ERROR" in line]
        assert len(errors) <= 2 and "Finished in state" not in "".join(errors), errors


def _fake_server_process(port: int, *extra: str) -> subprocess.Popen[str]:
    """The fake OpenAI server as its own process on ``port`` (a SIGKILL drops every
    connection and refuses new ones, as a crashed server does)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fake_openai",
            "--port",
            str(port),
            "--dims",
            "8",
            *extra,
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        env=_env(REPO),
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
    return proc


def _inputs_received(proc: subprocess.Popen[str]) -> int:
    import json

    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return int(json.loads(out.strip().splitlines()[-1])["inputs"])


def test_embedding_server_dying_mid_run_stops_in_seconds_and_a_rerun_sends_only_the_rest(
    tmp_path: Path,
) -> None:
    """The embedding server answered, then died: the first call to spend its attempts on
    refused connections opens the client's circuit breaker; the run stops dispatching,
    exits 1 with one line, keeps every published chunk, and the rerun (server back on the
    same URL) sends only the rows not published. Before: every remaining chunk spent its
    own retries and Prefect's task retry (164 s with 58 chunks left on the real file)."""
    rows = 400
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t {i}\n" for i in range(rows)))
    port = _closed_port()
    server = _fake_server_process(port, "--delay-s", "0.05")
    args = [
        sys.executable,
        "-m",
        "cli",
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
        "--output",
        "out",
        "--chunk-size",
        "4",
        "--concurrency",
        "2",
        "--max-attempts",
        "3",
    ]
    env = _env(tmp_path / "prefect-home")
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 180
        while len(list((tmp_path / "out").glob("chunks/*.parquet"))) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "no chunk published"
            time.sleep(0.05)
        server.kill()
        server.wait()
        killed = time.monotonic()
        out, err = proc.communicate(timeout=240)
        stopped_s = time.monotonic() - killed
    finally:
        proc.kill()
        server.kill()
    assert proc.returncode == 1, err[-3000:]
    assert stopped_s < 30, f"took {stopped_s:.0f} s to stop after the server died"
    assert "stopped accepting connections" in out and "rerun the same command" in err, out
    assert "Traceback" not in err, err[-3000:]
    published = int(out.split(" published now")[0].rsplit(" ", 1)[-1])
    not_run = int(out.split(" not run")[0].rsplit(" ", 1)[-1])
    assert published >= 3 and not_run >= 50, out  # 100 chunks: dispatching stopped early
    rows_kept = sum(1 for _ in (tmp_path / "out").glob("chunks/*.parquet")) * 4
    server = _fake_server_process(port)
    try:
        again = subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        sent = _inputs_received(server)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sent == rows - rows_kept, (sent, rows_kept)


def test_a_sigint_the_process_inherited_as_ignored_stays_ignored(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """A background job of a non-interactive shell starts with SIGINT ignored (POSIX), and
    Python keeps it so; embedline's own handlers (while importing Prefect, while
    dispatching) replaced it, so such a job stopped or not depending on the moment."""
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t {i}\n" for i in range(60)))
    fake_openai.fail_when(lambda payload: {"delay_s": 0.1})
    args = [
        sys.executable,
        "-m",
        "cli",
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--chunk-size",
        "4",
        "--concurrency",
        "2",
    ]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=_env(tmp_path / "prefect-home"),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        for _ in range(40):  # start-up, importing Prefect, then dispatching
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGINT)
            time.sleep(0.25)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "15 published now" in out, out


# -- item 2: the temporary Prefect server dies mid-run -----------------------------------------


def test_temporary_server_dying_mid_run_stops_at_once_and_a_rerun_finishes(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    from tests.support.processes import processes_with_env

    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t {i}\n" for i in range(80)))
    fake_openai.fail_when(lambda payload: {"delay_s": 0.3})
    home = tmp_path / "prefect-home"
    args = [
        sys.executable,
        "-m",
        "cli",
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--chunk-size",
        "4",
        "--concurrency",
        "2",
    ]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=_env(home),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 180
    while not list((tmp_path / "out").glob("chunks/*.parquet")):
        assert time.monotonic() < deadline and proc.poll() is None, "no chunk was published"
        time.sleep(0.1)
    for pid in processes_with_env("PREFECT_HOME", str(home)):
        if pid != proc.pid:
            os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=30)  # bounded: not minutes of client retries
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("embedline: error")]
    assert "the temporary Prefect server exited during the run" in line
    assert "rerun the same command to resume" in line
    # the summary, and a ledger that matches the store (in-flight chunks finished or released)
    published = len(list((tmp_path / "out").glob("chunks/*.parquet")))
    assert "status     interrupted" in out, out
    assert f"rows       {published * 4} published of 80" in out, out
    status = _cli(tmp_path, "status")
    assert "\tinterrupted\t" in status.stdout and " running=0 " in status.stdout, status.stdout
    assert f"published={published} " in status.stdout, status.stdout
    fake_openai.reset()
    rerun = _cli(
        tmp_path,
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--chunk-size",
        "4",
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "rows       80 published of 80" in rerun.stdout
    assert fake_openai.counters()["inputs"] == 80 - published * 4  # nothing paid twice
