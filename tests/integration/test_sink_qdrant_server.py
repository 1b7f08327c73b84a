"""The Qdrant sink's server mode against faults injected on loopback: a server that refuses the
API key, one that answers 503, and no server at all. (No Qdrant server ships on PyPI; the
happy path runs in local mode in the other sink tests.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("qdrant_client")

from adapters.sinks import open_sink
from embedline.errors import FatalError, RetryableError
from tests.support.csv_data import ENGLISH, read_rows, write_rows
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli
from tests.support.in_process import run_in_process
from tests.support.loopback_http import LoopbackRecorder

pytestmark = [pytest.mark.integration]

KEY = "k-s3cret-0123456789"


@pytest.fixture
def refusing() -> Iterator[LoopbackRecorder]:
    """A "Qdrant server" answering every request 401 (``status`` may be changed)."""
    with LoopbackRecorder(status=401, body={"status": {"error": "refused"}}) as server:
        yield server


def _uri(server: LoopbackRecorder) -> str:
    return f"qdrant://127.0.0.1:{server.port}/packages"


def test_a_refused_key_is_fatal_naming_the_variable_never_the_key(
    refusing: LoopbackRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QDRANT_API_KEY", KEY)
    sink = open_sink(_uri(refusing))
    with pytest.raises(FatalError) as caught:
        sink.ensure_table(embedder="openai", model="m", dimensions=4)
    sink.close()
    seen_keys = {r.headers.get("api-key") for r in refusing.requests}
    assert refusing.requests and seen_keys == {KEY}  # sent as the api-key header
    assert "QDRANT_API_KEY" in str(caught.value) and "401" in str(caught.value)
    assert KEY not in str(caught.value) and caught.value.exit_code == 3


def test_503_is_retryable_and_no_server_is_retryable(refusing: LoopbackRecorder) -> None:
    refusing.status = 503
    sink = open_sink(_uri(refusing))
    with pytest.raises(RetryableError) as caught:
        sink.describe()
    sink.close()
    assert "503" in str(caught.value) and caught.value.exit_code == 1
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = open_sink(f"qdrant://127.0.0.1:{port}/packages")
    with pytest.raises(RetryableError) as caught:
        sink.describe()
    sink.close()
    assert "unreachable" in str(caught.value)


def test_embedline_load_into_a_server_refusing_the_key_exits_3_in_one_line_without_the_key(
    refusing: LoopbackRecorder,
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    prefect_api_url: str,
) -> None:
    run_in_process(
        prefect_api_url,
        input=str(write_rows(tmp_path / "in.csv", read_rows(ENGLISH, 20))),
        embedder="openai",
        base_url=fake_openai.base_url,
        output=str(tmp_path / "out"),
        ledger=str(tmp_path / "l.sqlite3"),
    )
    loaded = run_cli(
        "load",
        "--to",
        _uri(refusing),
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "l.sqlite3"),
        cwd=tmp_path,
        env={"QDRANT_API_KEY": KEY},
    )
    assert loaded.returncode == 3, loaded.stderr[-2000:]
    last = loaded.stderr.strip().splitlines()[-1]
    assert "QDRANT_API_KEY" in last, last
    assert KEY not in loaded.stdout + loaded.stderr
