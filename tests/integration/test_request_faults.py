"""Request-side fault tolerance against the real FakeEmbeddingServer on loopback: RPM/TPM
pacing seen in the server's arrival times (``log[i]["at"]``), the fatal latch under
concurrent callers, and server waits above the cap."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.embeddings import OpenAIEmbedder
from embedline.errors import FatalError, RetryLaterError
from embedline.keys import request_key
from tests.support.fake_openai import FakeEmbeddingServer

pytestmark = pytest.mark.integration

KEY = request_key(["row-1"])
UNAUTHORIZED = json.dumps(
    {
        "error": {
            "message": "Incorrect API key provided: sk-te***",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
)


@pytest.fixture(scope="module")
def running_server() -> Iterator[FakeEmbeddingServer]:
    with FakeEmbeddingServer(dims=8) as server:
        yield server


@pytest.fixture
def server(running_server: FakeEmbeddingServer) -> Iterator[FakeEmbeddingServer]:
    running_server.reset()
    yield running_server
    running_server.reset()


def make(server: FakeEmbeddingServer, **overrides: Any) -> OpenAIEmbedder:
    """A client with the real (interruptible) sleep and the real clock."""
    options: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "text-embedding-3-small",
        "dimensions": None,
        "api_key": "sk-test",
        "timeout_s": 5.0,
        "max_attempts": 3,
    }
    options.update(overrides)
    return OpenAIEmbedder(**options)


def arrivals(server: FakeEmbeddingServer) -> list[float]:
    with server.lock:
        return sorted(entry["at"] for entry in server.log)


def run_threads(n: int, target: Any) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)


# -- pacing ---------------------------------------------------------------------------------


def test_rpm_600_spaces_six_threads_requests_evenly(server: FakeEmbeddingServer) -> None:
    emb = make(server, rpm=600, concurrency=8)  # one request every 0.1 s

    def worker(i: int) -> None:
        for j in range(2):
            emb.embed([f"thread {i} request {j}"], idempotency_key=KEY)

    run_threads(6, worker)
    emb.close()
    at = arrivals(server)
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert len(at) == 12
    assert sum(gaps) / len(gaps) >= 0.09
    assert min(gaps) >= 0.05  # evenly: no two requests together
    assert at[-1] - at[0] >= 1.0  # 11 gaps of 0.1 s, not a burst of 12
    assert at[-1] - at[0] < 2.5


def test_tpm_spacing_follows_the_tokens_the_server_counted(server: FakeEmbeddingServer) -> None:
    # The fake server counts one token per word; estimate_tokens (UTF-8 bytes / 3) books
    # about three times more. The pacer credits the difference back, so each gap is the
    # previous request's *used* tokens at 0.05 s/token; booked estimates would double them.
    emb = make(server, tpm=1200)  # 20 tokens/s
    words = [4, 12, 2, 8]
    for n in words:
        emb.embed([" ".join(["hello"] * n)], idempotency_key=KEY)
    emb.close()
    at = arrivals(server)
    gaps = [b - a for a, b in itertools.pairwise(at)]
    for gap, used in zip(gaps, words, strict=False):
        assert gap <= used * 0.05 + 0.12  # credited back: booked estimates would triple it
    # paced overall (the pacer tolerates a burst of about one token, and arrival times
    # carry the server's scheduling jitter, so single gaps are not checked from below)
    assert at[-1] - at[0] >= sum(words[:-1]) * 0.05 - 0.1


def test_a_request_above_the_whole_tpm_is_sent_and_paid_for(
    server: FakeEmbeddingServer,
) -> None:
    waits: list[float] = []  # recorded, not slept
    emb = make(server, tpm=60, sleep=waits.append)  # 1 token/s
    started = time.monotonic()
    big = emb.embed(["word " * 200], idempotency_key=KEY)  # 200 used: over 3 minutes' worth
    assert big.tokens == 200 and time.monotonic() - started < 1.0  # no deadlock
    emb.embed(["next"], idempotency_key=KEY)
    emb.close()
    assert waits == [pytest.approx(200.0, abs=1.0)]  # the next one pays for the 200 used
    assert server.requests == 2


# -- fatal latch ----------------------------------------------------------------------------


def test_after_the_first_401_at_most_one_request_per_slot_reaches_the_server(
    server: FakeEmbeddingServer,
) -> None:
    lock = threading.Lock()
    seen = {"n": 0}

    def answer(_: Any) -> dict[str, Any]:
        with lock:
            seen["n"] += 1
            n = seen["n"]
        if n <= 8:
            return {"delay_s": 0.03}
        return {"status": 401, "delay_s": 0.03, "body": UNAUTHORIZED}  # the key was revoked

    server.fail_when(answer)
    emb = make(server, concurrency=4, max_attempts=3)
    errors: dict[int, list[FatalError]] = {i: [] for i in range(4)}
    ok: dict[int, int] = dict.fromkeys(range(4), 0)

    def worker(i: int) -> None:  # a task thread taking chunk after chunk
        for chunk in range(12):
            try:
                emb.embed([f"chunk {i}-{chunk}"], idempotency_key=KEY)
                ok[i] += 1
            except FatalError as exc:
                errors[i].append(exc)

    run_threads(4, worker)
    emb.close()
    with server.lock:
        statuses = [entry["status"] for entry in server.log]
    first_401 = statuses.index(401)
    assert len(statuses) - first_401 - 1 <= 4  # 40 would arrive without the latch
    assert sum(ok.values()) <= 8
    assert all(errors[i] for i in range(4))  # every thread got a FatalError
    for exc in (e for errs in errors.values() for e in errs):
        assert exc.http_status == 401 and "EMBEDLINE_API_KEY" in str(exc)
        assert "sk-te" not in str(exc)


def test_a_call_sleeping_in_backoff_stops_within_a_second_of_a_401(
    server: FakeEmbeddingServer,
) -> None:
    server.script(
        [{"status": 503, "headers": {"Retry-After": "30"}}, {"status": 401, "body": UNAUTHORIZED}]
    )
    emb = make(server, max_attempts=5)
    outcome: list[BaseException] = []

    def backing_off(_: int) -> None:
        try:
            emb.embed(["first"], idempotency_key=KEY)
        except BaseException as exc:  # noqa: BLE001 (checked by the test thread)
            outcome.append(exc)

    thread = threading.Thread(target=backing_off, args=(0,))
    thread.start()
    while server.requests < 1:
        time.sleep(0.005)
    time.sleep(0.1)  # now sleeping the server's 30 s
    started = time.monotonic()
    with pytest.raises(FatalError):
        emb.embed(["second"], idempotency_key=KEY)
    thread.join(timeout=5)
    emb.close()
    assert not thread.is_alive() and time.monotonic() - started < 1.0
    assert isinstance(outcome[0], FatalError)
    assert server.requests == 2  # the sleeper never resent


# -- server waits ---------------------------------------------------------------------------


def test_429_retry_after_ms_200_is_slept_and_retried_once(server: FakeEmbeddingServer) -> None:
    server.script([{"status": 429, "headers": {"retry-after-ms": "200"}}])
    emb = make(server, max_attempts=5)
    result = emb.embed(["a text"], idempotency_key=KEY)
    emb.close()
    assert result.requests == 2
    at = arrivals(server)
    assert at[1] - at[0] >= 0.2


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_600_raises_retry_later_at_once(
    server: FakeEmbeddingServer, status: int
) -> None:
    server.script([{"status": status, "headers": {"Retry-After": "600"}}])
    emb = make(server, max_attempts=5)
    started = time.monotonic()
    with pytest.raises(RetryLaterError) as caught:
        emb.embed(["a text"], idempotency_key=KEY)
    assert time.monotonic() - started < 0.5  # nothing slept
    assert caught.value.retry_after_s == 600.0 and caught.value.http_status == status
    assert server.requests == 1


def test_a_long_429_defers_the_next_calls_without_sending(server: FakeEmbeddingServer) -> None:
    server.script([{"status": 429, "headers": {"Retry-After": "600"}}])
    emb = make(server, max_attempts=5)
    with pytest.raises(RetryLaterError):
        emb.embed(["a text"], idempotency_key=KEY)
    with pytest.raises(RetryLaterError) as caught:
        emb.embed(["another"], idempotency_key=KEY)
    assert 590 < caught.value.retry_after_s <= 600  # type: ignore[operator]
    assert server.requests == 1


def test_reset_after_work_is_retried_with_the_same_idempotency_key(
    server: FakeEmbeddingServer,
) -> None:
    server.script([{"reset": True, "after_work": True}])
    emb = make(server, rpm=600)
    result = emb.embed(["a text"], idempotency_key=KEY)
    emb.close()
    assert result.requests == 2
    with server.lock:
        assert [entry["idempotency_key"] for entry in server.log] == [KEY, KEY]
        assert [entry["status"] for entry in server.log] == ["reset", 200]
