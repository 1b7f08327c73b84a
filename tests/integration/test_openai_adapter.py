"""OpenAIEmbedder against the real FakeEmbeddingServer on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from adapters.embeddings import OpenAIEmbedder
from embedline.errors import (
    BadResponseError,
    EmbedlineError,
    EndpointDownError,
    FatalError,
    RateLimitedError,
    RetryableError,
    RowError,
)
from embedline.keys import request_key
from tests.support.fake_openai import FakeEmbeddingServer, expected_matrix, expected_vector

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["hello world", "日本語のテキスト", "a third, longer text with several words"]
KEY = request_key(["row-1", "row-2", "row-3"])


@pytest.fixture(scope="module")
def running_server() -> Iterator[FakeEmbeddingServer]:
    with FakeEmbeddingServer(dims=384) as server:
        yield server


@pytest.fixture
def server(running_server: FakeEmbeddingServer) -> Iterator[FakeEmbeddingServer]:
    running_server.reset()
    yield running_server
    running_server.reset()
    running_server.shuffle_index = False
    running_server.require_key = None
    running_server.reject_texts_containing = None
    running_server.accept_base64 = True


class Recorder:
    """Injected sleep: records every wait; sleeps for real only when ``real``."""

    def __init__(self, real: bool = False) -> None:
        self.real = real
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.real:
            time.sleep(seconds)


def make(server: FakeEmbeddingServer, **overrides: Any) -> OpenAIEmbedder:
    options: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "text-embedding-3-small",
        "dimensions": None,
        "api_key": "sk-test",
        "timeout_s": 5.0,
        "max_attempts": 3,
        "sleep": Recorder(),
    }
    options.update(overrides)
    return OpenAIEmbedder(**options)


def test_vectors_match_each_text(server: FakeEmbeddingServer) -> None:
    emb = make(server)
    result = emb.embed(TEXTS, idempotency_key=KEY)
    emb.close()
    assert result.vectors.dtype == np.float32 and result.vectors.shape == (3, 384)
    for text, vector in zip(TEXTS, result.vectors, strict=True):
        np.testing.assert_array_equal(vector, expected_vector(text))
    assert result.tokens == sum(len(t.split()) for t in TEXTS)
    assert result.requests == 1
    assert server.log[0]["encoding_format"] == "base64"


def test_shuffled_index_order_maps_back_to_each_text(server: FakeEmbeddingServer) -> None:
    server.shuffle_index = True
    result = make(server).embed(TEXTS, idempotency_key=KEY)
    np.testing.assert_array_equal(result.vectors, expected_matrix(TEXTS))


def test_float_path_after_the_server_refuses_base64(server: FakeEmbeddingServer) -> None:
    server.accept_base64 = False
    emb = make(server)
    first = emb.embed(TEXTS, idempotency_key=KEY)
    second = emb.embed(TEXTS[:1], idempotency_key=KEY)
    np.testing.assert_allclose(first.vectors, expected_matrix(TEXTS), rtol=1e-6)
    np.testing.assert_allclose(second.vectors, expected_matrix(TEXTS[:1]), rtol=1e-6)
    assert [e["encoding_format"] for e in server.log] == ["base64", "float", "float"]
    assert [e["status"] for e in server.log] == [400, 200, 200]


def test_dimensions_are_requested_and_checked(server: FakeEmbeddingServer) -> None:
    result = make(server, dimensions=64).embed(TEXTS, idempotency_key=KEY)
    np.testing.assert_array_equal(result.vectors, expected_matrix(TEXTS, 64))
    assert server.log[0]["dimensions"] == 64


def test_retry_after_503_and_reset_resends_the_same_key(server: FakeEmbeddingServer) -> None:
    server.script([{"status": 503}, {"reset": True}])
    sleep = Recorder()
    result = make(server, sleep=sleep).embed(TEXTS, idempotency_key=KEY)
    np.testing.assert_array_equal(result.vectors, expected_matrix(TEXTS))
    assert result.requests == 3 and len(sleep.waits) == 2
    assert [e["status"] for e in server.log] == [503, "reset", 200]
    assert {e["idempotency_key"] for e in server.log} == {KEY}


def test_reset_after_the_work_was_done_is_retried_with_the_same_key(
    server: FakeEmbeddingServer,
) -> None:
    server.script([{"reset": True, "after_work": True}])
    result = make(server).embed(TEXTS, idempotency_key=KEY)
    np.testing.assert_array_equal(result.vectors, expected_matrix(TEXTS))
    assert server.counters() == {"requests": 2, "inputs": 6}  # the server worked twice
    assert [e["idempotency_key"] for e in server.log] == [KEY, KEY]


def test_read_timeout_is_retried(server: FakeEmbeddingServer) -> None:
    server.script([{"delay_s": 0.6}])
    result = make(server, timeout_s=0.2).embed(TEXTS, idempotency_key=KEY)
    assert result.requests == 2
    np.testing.assert_array_equal(result.vectors, expected_matrix(TEXTS))


def test_before_send_runs_before_every_attempt_and_what_it_raises_sends_nothing_more(
    server: FakeEmbeddingServer,
) -> None:
    server.script([{"status": 503}])
    seen: list[int] = []

    class Fenced(EmbedlineError):
        pass

    def before_send() -> None:  # a chunk lease's fence: lost before the retry
        seen.append(server.counters()["requests"])
        if len(seen) == 2:
            raise Fenced("another copy took the chunk")

    with pytest.raises(Fenced) as caught:
        make(server).embed(TEXTS, idempotency_key=KEY, before_send=before_send)
    assert seen == [0, 1]  # before the first request, and before the retry
    assert [e["status"] for e in server.log] == [503]  # the retry was not sent
    assert (caught.value.requests, caught.value.inputs) == (1, 3)  # what went out before


def test_429_retry_after_ms_sleeps_then_retries_once(server: FakeEmbeddingServer) -> None:
    server.script(
        [
            {
                "status": 429,
                "headers": {"retry-after-ms": "200"},
                "body": json.dumps(
                    {
                        "error": {
                            "message": "slow down",
                            "type": "requests",
                            "code": "rate_limit_exceeded",
                        }
                    }
                ),
            }
        ]
    )
    sleep = Recorder(real=True)
    started = time.monotonic()
    result = make(server, sleep=sleep).embed(TEXTS, idempotency_key=KEY)
    assert result.requests == 2 and server.requests == 2
    assert sleep.waits == [pytest.approx(0.2)]
    assert time.monotonic() - started >= 0.2
    assert server.log[1]["at"] - server.log[0]["at"] >= 0.2


def test_429_pauses_every_request_of_the_client(server: FakeEmbeddingServer) -> None:
    server.script([{"status": 429, "headers": {"retry-after-ms": "300"}}])
    emb = make(server, sleep=Recorder(real=True))
    first = threading.Thread(target=emb.embed, args=(TEXTS,), kwargs={"idempotency_key": KEY})
    first.start()
    while server.requests < 1 or server.log[0]["status"] is None:
        time.sleep(0.005)
    time.sleep(0.02)  # the 429 has reached the client
    other = request_key(["row-9"])
    emb.embed(["another request"], idempotency_key=other)
    first.join()
    rate_limited_at = server.log[0]["at"]
    other_at = next(e["at"] for e in server.log if e["idempotency_key"] == other)
    assert other_at - rate_limited_at >= 0.25


def test_two_html_502_pages_then_success(server: FakeEmbeddingServer) -> None:
    page = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    server.script([{"status": 502, "body": page}, {"status": 502, "body": page}])
    result = make(server).embed(TEXTS, idempotency_key=KEY)
    assert result.requests == 3
    np.testing.assert_array_equal(result.vectors, expected_matrix(TEXTS))


def test_insufficient_quota_is_fatal_without_retry(server: FakeEmbeddingServer) -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    server.script([{"status": 429, "body": json.dumps(body), "headers": {"retry-after-ms": "1"}}])
    with pytest.raises(FatalError) as caught:
        make(server, max_attempts=5).embed(TEXTS, idempotency_key=KEY)
    assert not isinstance(caught.value, RateLimitedError)
    assert server.requests == 1


def test_wrong_key_is_fatal_and_right_key_works(server: FakeEmbeddingServer) -> None:
    server.require_key = "sk-right"
    with pytest.raises(FatalError, match="EMBEDLINE_API_KEY") as caught:
        make(server, api_key="sk-wrong", max_attempts=5).embed(TEXTS, idempotency_key=KEY)
    assert caught.value.http_status == 401 and "sk-wrong" not in str(caught.value)
    assert server.requests == 1
    assert make(server, api_key="sk-right").embed(TEXTS, idempotency_key=KEY).requests == 1


def test_rejected_input_is_a_row_error(server: FakeEmbeddingServer) -> None:
    server.reject_texts_containing = "FORBIDDEN"
    with pytest.raises(RowError) as caught:
        make(server).embed(["fine", "this is FORBIDDEN text"], idempotency_key=KEY)
    assert caught.value.reason == "rejected" and caught.value.http_status == 400
    assert "FORBIDDEN" not in str(caught.value)
    assert server.requests == 1


def _bad_200(mutate: Any) -> Any:
    """A fail_when hook answering a valid-looking 200 that ``mutate`` breaks."""

    def hook(request_json: dict[str, Any]) -> dict[str, Any]:
        n = len(request_json["input"])
        data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.5]} for i in range(n)]
        body = {"object": "list", "data": data, "model": "m", "usage": {"total_tokens": 1}}
        mutate(body)
        return {"status": 200, "body": json.dumps(body)}

    return hook


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b["data"].pop(),
        lambda b: b["data"][1].__setitem__("index", 0),
        lambda b: b["data"][0].__setitem__("embedding", [float("nan"), 0.5]),
    ],
    ids=["wrong count", "duplicate index", "nan"],
)
def test_bad_responses_are_retried_once_then_fail(server: FakeEmbeddingServer, mutate: Any) -> None:
    server.fail_when(_bad_200(mutate))
    sleep = Recorder()
    with pytest.raises(BadResponseError):
        make(server, max_attempts=6, sleep=sleep).embed(TEXTS, idempotency_key=KEY)
    assert server.requests == 2 and len(sleep.waits) == 1


def test_no_authorization_header_without_a_key(server: FakeEmbeddingServer) -> None:
    make(server, api_key=None).embed(TEXTS, idempotency_key=KEY)
    make(server, api_key="sk-x").embed(TEXTS, idempotency_key=KEY)
    assert [e["authorization"] for e in server.log] == [False, True]


def test_retries_exhausted_raise_the_last_retryable_error(server: FakeEmbeddingServer) -> None:
    server.script([{"status": 503}] * 2)
    with pytest.raises(RetryableError) as caught:
        make(server, max_attempts=2).embed(TEXTS, idempotency_key=KEY)
    assert caught.value.http_status == 503 and server.requests == 2


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_endpoint_that_never_answered_stops_the_client_after_one_call() -> None:
    """Connection refused on every attempt of the first call, no answer ever: the endpoint
    is wrong or down, so the call is fatal and latches (before: each chunk spent its own
    retries on it, minutes for a large input)."""
    sleep = Recorder()
    client = OpenAIEmbedder(
        base_url=f"http://127.0.0.1:{_closed_port()}/v1",
        model="text-embedding-3-small",
        dimensions=None,
        api_key="sk-test",
        timeout_s=5.0,
        max_attempts=3,
        sleep=sleep,
    )
    with pytest.raises(FatalError) as caught:
        client.embed(TEXTS, idempotency_key=KEY)
    assert "no request of this run ever reached it" in str(caught.value)
    assert "--base-url" in str(caught.value)
    assert caught.value.requests == 0  # three refused connections: no request was sent
    assert len(sleep.waits) == 2  # the call's own retries still happen
    with pytest.raises(FatalError):  # latched: nothing more is sent
        client.embed(TEXTS, idempotency_key=KEY)
    assert len(sleep.waits) == 2 and client.fatal_error is caught.value


def test_an_endpoint_that_answered_before_and_goes_away_opens_the_circuit_breaker() -> None:
    """A server that answered once and then went away is an outage, not a wrong URL: the
    call fails retryably (``EndpointDownError``: the chunk fails, exit 1, a rerun resumes),
    not fatally, and the client sends nothing more, so the other chunks stop at once."""
    sleep = Recorder()
    no_keepalive = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
    with FakeEmbeddingServer(dims=384) as gone:
        client = make(gone, client=no_keepalive, max_attempts=3, sleep=sleep)
        client.embed(TEXTS, idempotency_key=KEY)  # a kept-alive connection would outlive it
    with pytest.raises(EndpointDownError) as caught:
        client.embed(TEXTS, idempotency_key=KEY)
    assert isinstance(caught.value, RetryableError) and not isinstance(caught.value, FatalError)
    assert "stopped accepting connections" in str(caught.value)
    assert caught.value.requests == 0 and len(sleep.waits) == 2  # refused: nothing was sent
    with pytest.raises(EndpointDownError):
        client.embed(TEXTS, idempotency_key=KEY)
    assert len(sleep.waits) == 2  # latched: no new attempt, no wait
    assert client.endpoint_down is caught.value and client.fatal_error is None
    no_keepalive.close()


def test_fake_server_runs_standalone_for_benchmarks() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_openai", "--port", "0", "--dims", "8"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        assert ready[0] == "READY" and ready[1].startswith("http://127.0.0.1:")
        response = httpx.post(f"{ready[1]}/embeddings", json={"model": "m", "input": ["a", "b"]})
        assert response.status_code == 200 and len(response.json()["data"][0]["embedding"]) == 8
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1]) == {"requests": 1, "inputs": 2}
