"""Proof against software no one here wrote (issue 8): the main job through LiteLLM's proxy,
a real OpenAI-compatible server installed from PyPI (``litellm[proxy]``) and started by this
test, forwarding to the loopback fake server. Every published vector is checked against the
fake server's deterministic vector for its text, so whatever LiteLLM does to requests and
answers (encoding_format, index, usage, headers) is exercised end to end.

Slow (LiteLLM starts in about 20-40 s) and needs LiteLLM in its own venv, which
``make test-real-servers`` installs (``.venv-litellm``) and passes as ``EMBEDLINE_LITELLM``.
"""

from __future__ import annotations

import csv
import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.output import read_local_output

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("prefect_api_url")]

MODEL = "text-embedding-3-small"
MASTER_KEY = "sk-" + secrets.token_hex(32)  # LiteLLM refuses to start without a strong one


def _litellm() -> str:
    found = os.environ.get("EMBEDLINE_LITELLM") or shutil.which("litellm")
    local = REPO / ".venv-litellm" / "bin" / "litellm"
    if not found and local.exists():
        found = str(local)
    if not found:
        pytest.fail(
            "LiteLLM is not installed: run `make test-real-servers` (it installs "
            "litellm[proxy] into .venv-litellm and runs this test)"
        )
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def litellm_proxy(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> Iterator[str]:
    """LiteLLM's proxy on loopback in front of ``fake_openai``; yields its ``/v1`` base URL."""
    port = _free_port()
    config = tmp_path / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {fake_openai.base_url}\n"
        "      api_key: sk-upstream\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
    )
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "DO_NOT_TRACK": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    log = open(tmp_path / "litellm.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [_litellm(), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{base}/health/liveliness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(
                    "LiteLLM did not start: " + (tmp_path / "litellm.log").read_text()[-2000:]
                )
            time.sleep(0.5)
        yield f"{base}/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def test_the_main_job_through_litellms_proxy(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, litellm_proxy: str
) -> None:
    texts = {f"{i:03d}": f"package {i}: a line of text, ünïcode 日本語 {i * 13}" for i in range(60)}
    texts["007"] = ""  # a dead letter never sent
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([("id", "text"), *texts.items()])
    (tmp_path / "in.csv").write_text(buf.getvalue(), encoding="utf-8")
    result = run_cli(
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--model",
        MODEL,
        "--base-url",
        litellm_proxy,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "16",
        "--batch-size",
        "8",
        "--allow-failed-rows",
        cwd=tmp_path,
        env={"EMBEDLINE_API_KEY": MASTER_KEY},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_published"] == 59 and manifest["rows_failed"] == 1
    assert set(vectors) == set(texts) - {"007"}
    for row_id, vector in vectors.items():
        np.testing.assert_allclose(vector, expected_vector(texts[row_id]), atol=1e-6)
    assert fake_openai.requests >= 8  # the proxy really forwarded every batch
