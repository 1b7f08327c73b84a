"""The Prefect API goes away in the middle of ``embedline run`` (issue 10, item 2).

The fault is real: a ``prefect server start`` process (its own ``PREFECT_HOME``) is SIGKILLed
while chunks are in flight against a slow fake embeddings server. The CLI must stop within
seconds (not Prefect's client retries: about a minute per call), print its summary and one
error line, leave a ledger that matches the store, and a rerun against a restarted server
must send only the rows the store does not hold yet.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO
from tests.support.forked_cli import run_cli_process
from tests.support.prefect_home import fresh_prefect_home
from tests.support.prefect_server import start_prefect_server
from tests.support.processes import wait_until_gone

pytestmark = pytest.mark.integration

ROWS, CHUNK = 800, 4  # 200 chunks; at 0.3 s a request and 2 in flight: about 30 s of work


def _env(cli_home: Path, api_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PREFECT_HOME": str(cli_home),
        "PREFECT_API_URL": api_url,
    }


def _run_args(fake: FakeEmbeddingServer) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli",
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake.base_url,
        "--output",
        "out",
        "--chunk-size",
        str(CHUNK),
        "--concurrency",
        "2",
    ]


def _objects(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out").glob("chunks/*.parquet"))


def _kill(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)  # the server and its uvicorn child
    server.wait()


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("embedline: error")]


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_configured_server_killed_mid_run_stops_in_seconds_and_a_rerun_pays_only_the_rest(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = {f"r{i}": f"text {i}" for i in range(ROWS)}
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{k},{v}\n" for k, v in texts.items()))
    server_home, cli_home = tmp_path / "server-home", tmp_path / "cli-home"
    fresh_prefect_home(server_home)  # migrated already: the server is up 6-7 s sooner
    server, url = start_prefect_server(server_home)
    fake_openai.fail_when(lambda payload: {"delay_s": 0.3})
    proc = subprocess.Popen(
        _run_args(fake_openai),
        cwd=tmp_path,
        env=_env(cli_home, url),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while len(_objects(tmp_path)) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "no chunk was published"
            time.sleep(0.05)
        _kill(server)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=60)  # before the fix: 154 s
        stopped_s = time.monotonic() - killed
    finally:
        _kill(server)
        if proc.poll() is None:  # the test failed: leave no process behind
            proc.kill()
            proc.communicate()
    # bounded: 2 s of refused probes + the in-flight requests (0.3 s), not minutes of retries
    assert stopped_s < 15, (stopped_s, err[-3000:])
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "Error logging to API" not in err
    assert "EventsWorker" not in err, err[-3000:]
    [line] = _error_lines(err)
    assert f"the Prefect API at {url} (PREFECT_API_URL) stopped answering" in line
    assert "restart that server and rerun the same command" in line
    published = len(_objects(tmp_path))
    assert 2 <= published < ROWS // CHUNK
    assert "status     interrupted" in out, out
    assert f"rows       {published * CHUNK} published of {ROWS}" in out, out
    # the ledger matches the store: every object recorded, nothing left running
    status = run_cli_process(
        [sys.executable, "-m", "cli", "status"],
        cwd=tmp_path,
        env=_env(cli_home, url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "\tinterrupted\t" in status.stdout, status.stdout
    assert f"rows={published * CHUNK}/{ROWS}" in status.stdout, status.stdout
    assert f"published={published} " in status.stdout and " running=0 " in status.stdout
    assert wait_until_gone("PREFECT_HOME", str(cli_home), 10) == []

    # the server is back: the rerun sends only the rows the store does not hold
    fake_openai.reset()
    server, url = start_prefect_server(server_home)
    try:
        rerun = subprocess.run(
            _run_args(fake_openai),
            cwd=tmp_path,
            env=_env(cli_home, url),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        _kill(server)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert fake_openai.counters()["inputs"] == ROWS - published * CHUNK
    import embedline

    frame = embedline.read_embeddings(str(tmp_path / "out"))
    assert sorted(frame.id) == sorted(texts)
    for row in frame.itertuples():
        np.testing.assert_allclose(row.embedding, expected_vector(texts[row.id]), atol=1e-6)


@pytest.mark.parametrize("sink", [False, True], ids=["no-sink", "sink"])
def test_api_lost_just_after_the_commit_prints_the_committed_run_at_once(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, sink: bool
) -> None:
    """The server dies right after the manifest's PUT: the run is complete (with a sink, the
    load needs no Prefect call and completes), and only the flow's reporting to Prefect
    (artifacts, final state) is left, which would retry for a minute. Before: exit 1 after
    42 s (``--grace`` + 10 s waiting for a hand-over that never came), with "rerun the same
    command to resume" and no summary; the load's summary was never printed either."""
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},text {i}\n" for i in range(40)))
    server_home, cli_home = tmp_path / "server-home", tmp_path / "cli-home"
    fresh_prefect_home(server_home)  # migrated already: the server is up 6-7 s sooner
    server, url = start_prefect_server(server_home)
    env = {
        **_env(cli_home, url),
        "PYTHONPATH": os.pathsep.join((str(REPO / "tests/support/signal_at"), str(REPO))),
        "EMBEDLINE_TEST_SIGNALS": (
            f"after:tasks.commit.commit_run:write_manifest:SIGKILL@{server.pid}"
        ),
    }
    extra = ["--sink", f"lancedb://{tmp_path}/lance?table=t"] if sink else []
    started = time.monotonic()
    try:
        done = subprocess.run(
            _run_args(fake_openai) + extra,
            cwd=tmp_path,
            env=env,
            text=True,
            capture_output=True,
            timeout=120,
        )
    finally:
        _kill(server)
    took_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert took_s < 30, (took_s, done.stderr[-3000:])
    assert "status     complete" in done.stdout and "rows       40 published of 40" in done.stdout
    assert ("rows       40 upserted now" in done.stdout) is sink, done.stdout
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"embedline: warning: the Prefect API at {url} (PREFECT_API_URL) "
        "stopped answering during the run"
    ), last
    assert last.endswith("after the run completed; this run is missing from the Prefect UI")
    status = run_cli_process(
        [sys.executable, "-m", "cli", "status"],
        cwd=tmp_path,
        env=_env(cli_home, url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "\tcomplete\t" in status.stdout and "rows=40/40" in status.stdout, status.stdout


def test_health_probe_calls_a_refused_port_gone_after_2_s_and_a_silent_one_later(
    monkeypatch: pytest.MonkeyPatch, fake_openai: FakeEmbeddingServer
) -> None:
    from cli import prefect_env
    from cli.prefect_env import HealthProbe

    answering = HealthProbe(fake_openai.base_url)  # any HTTP answer: someone is there
    assert answering.lost() is None and answering.lost() is None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = HealthProbe(f"http://127.0.0.1:{port}/api")
    assert refused.lost() is None  # the first refusal starts the clock
    time.sleep(prefect_env.API_REFUSED_AFTER_S)
    loss = refused.lost()
    assert loss is not None and "ConnectError" in loss.what, loss
    assert f"127.0.0.1:{port}/api (PREFECT_API_URL) stopped answering" in loss.what
    monkeypatch.setattr(prefect_env, "API_SILENT_AFTER_S", 3.0)
    with socket.socket() as listening:  # accepts connections (kernel backlog), never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        silent = HealthProbe(f"http://127.0.0.1:{listening.getsockname()[1]}/api")
        assert silent.lost() is None  # a read timeout (2 s) is not yet a loss
        loss = silent.lost()
    assert loss is not None and "ReadTimeout" in loss.what, loss


def test_health_probes_share_one_connection_and_still_see_the_server_go() -> None:
    """Two probes a second for a whole run: one kept-alive connection, not a new client (and
    SSL context, 25 ms of CPU) per probe. A server that dies behind that connection is still
    called gone once refusals have lasted API_REFUSED_AFTER_S."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from cli import prefect_env
    from cli.prefect_env import HealthProbe

    connections: list[object] = []

    class Health(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def setup(self) -> None:
            connections.append(self.request)
            super().setup()

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    probe = HealthProbe(f"http://127.0.0.1:{server.server_address[1]}/api")
    try:
        assert all(probe.lost() is None for _ in range(5))
        assert len(connections) == 1
        server.shutdown()  # the process "dies": its listening socket and connections close
        server.server_close()
        for connection in connections:
            connection.shutdown(socket.SHUT_RDWR)
            connection.close()
        deadline = time.monotonic() + prefect_env.API_REFUSED_AFTER_S + 3
        loss = None
        while loss is None and time.monotonic() < deadline:
            loss = probe.lost()
            time.sleep(0.2)
        assert loss is not None and "stopped answering" in loss.what, loss
    finally:
        probe.close()
        server.server_close()


def test_api_lost_before_dispatching_exits_in_seconds_and_the_run_reads_interrupted(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    """The flow has recorded its run but not dispatched a chunk yet (held in the output's
    conditional-write probe, a PUT through a proxy that waits) when the server dies. The CLI
    has no summary to wait for: it exits 1 with one line, and the run must read
    ``interrupted`` (nothing lost, the rerun resumes), not ``crashed`` as before."""
    from tests.support.s3_proxy import FirstPutHold, ResettingProxy

    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},text {i}\n" for i in range(8)))
    server_home, cli_home = tmp_path / "server-home", tmp_path / "cli-home"
    fresh_prefect_home(server_home)  # migrated already: the server is up 6-7 s sooner
    hold = FirstPutHold()
    server, url = start_prefect_server(server_home)
    with ResettingProxy(moto_endpoint, fault=hold) as proxy:
        env = {**_env(cli_home, url), "AWS_ENDPOINT_URL": proxy.url}
        args = [a if a != "out" else f"s3://{s3_bucket}/out" for a in _run_args(fake_openai)]
        proc = subprocess.Popen(
            args, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert hold.reached.wait(120), "the flow never reached the store"
            _kill(server)
            killed = time.monotonic()
            _out, err = proc.communicate(timeout=60)
            stopped_s = time.monotonic() - killed
        finally:
            hold.release.set()
            _kill(server)
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert stopped_s < 15, (stopped_s, err[-3000:])
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    [line] = _error_lines(err)
    assert "stopped answering" in line and "rerun the same command" in line, line
    assert fake_openai.counters()["inputs"] == 0
    status = run_cli_process(
        [sys.executable, "-m", "cli", "status"],
        cwd=tmp_path,
        env=_env(cli_home, url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "\tinterrupted\t" in status.stdout, status.stdout
    assert " running=0 " in status.stdout, status.stdout
