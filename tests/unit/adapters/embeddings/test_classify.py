"""adapters.embeddings without sockets: every classification branch, response parsing,
request shape, retries, the shared pause, the concurrency limit, RPM/TPM pacing, the fatal
latch and server waits above the cap, via httpx.MockTransport and a fake clock."""

from __future__ import annotations

import base64
import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from adapters.embeddings import (
    LocalEmbedder,
    OpenAIEmbedder,
    api_key_from_env,
    build_embedder,
    classify,
    close_embedders,
    estimate_tokens,
)
from embedline.errors import (
    BadResponseError,
    EndpointDownError,
    FatalError,
    InputError,
    RateLimitedError,
    RetryableError,
    RetryLaterError,
    RowError,
)
from embedline.retry import request_retrying
from embedline.settings import RunSettings

REPO = Path(__file__).resolve().parents[4]
BASE_URL = "https://api.example.test/v1"
MODEL = "text-embedding-3-small"
API_KEY = "sk-test-SECRET-0123456789"
IDEM = "f" * 64
SECRET_TEXT = "the quarterly numbers are confidential"
Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBEDLINE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def make_embedder(
    handler: Handler,
    *,
    api_key: str | None = API_KEY,
    dimensions: int | None = None,
    max_attempts: int = 1,
    concurrency: int = 8,
    sleep: Callable[[float], None] | None = lambda s: None,
    base_url: str = BASE_URL,
    **options: Any,
) -> OpenAIEmbedder:
    options.setdefault("encoding_format", "base64")  # no float probe unless a test asks
    return OpenAIEmbedder(
        base_url=base_url,
        model=MODEL,
        dimensions=dimensions,
        api_key=api_key,
        timeout_s=5.0,
        max_attempts=max_attempts,
        concurrency=concurrency,
        client=httpx.Client(transport=httpx.MockTransport(handler)),
        sleep=sleep,
        **options,
    )


def vectors_for(n: int, dims: int = 4) -> np.ndarray:
    return (np.arange(n * dims, dtype=np.float32).reshape(n, dims) + 1) / 100


def ok_body(
    request: httpx.Request,
    *,
    dims: int = 4,
    order: list[int] | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    body = json.loads(request.content)
    n = len(body["input"])
    matrix = vectors_for(n, dims)
    encode = body.get("encoding_format") == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(matrix[i].astype("<f4").tobytes()).decode()
            if encode
            else matrix[i].tolist(),
        }
        for i in (order if order is not None else range(n))
    ]
    return {
        "object": "list",
        "data": data,
        "model": MODEL,
        "usage": usage if usage is not None else {"prompt_tokens": n, "total_tokens": n},
    }


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=ok_body(request))


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, (str, bytes)):
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return handler


def openai_error(
    code: str | None, message: str = "error", type_: str = "invalid_request_error"
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


class Sequenced:
    """Answers with the given handlers in turn (the last repeats); records requests."""

    def __init__(self, *handlers: Handler) -> None:
        self.handlers = list(handlers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        handler = self.handlers[min(len(self.requests), len(self.handlers)) - 1]
        return handler(request)


def embed_error(handler: Handler, **kwargs: Any) -> BaseException:
    with pytest.raises(Exception) as caught:
        make_embedder(handler, **kwargs).embed(["a", SECRET_TEXT], idempotency_key=IDEM)
    return caught.value


def assert_clean(message: str) -> None:
    for secret in (API_KEY, SECRET_TEXT, IDEM):
        assert secret not in message


# -- transport errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc_type",
    [
        httpx.ConnectTimeout,
        httpx.ReadTimeout,
        httpx.WriteTimeout,
        httpx.PoolTimeout,
        httpx.ReadError,
        httpx.WriteError,
        httpx.RemoteProtocolError,
        httpx.ProxyError,
    ],
)
def test_transport_failures_are_retryable(exc_type: type[httpx.RequestError]) -> None:
    """Retryable, and the client keeps sending (a ``ConnectError`` that outlives a call's
    attempts opens the circuit breaker: the cases below)."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise exc_type("boom", request=request)

    client = make_embedder(Sequenced(ok, fail))
    client.embed(["a"], idempotency_key=IDEM)
    with pytest.raises(Exception) as caught:
        client.embed(["a", SECRET_TEXT], idempotency_key=IDEM)
    error = caught.value
    assert type(error) is RetryableError
    assert isinstance(error.__cause__, exc_type)
    assert exc_type.__name__ in str(error)
    assert client.endpoint_down is None and client.fatal_error is None


def test_refused_connections_after_answers_open_the_circuit_breaker() -> None:
    """The server answered, then refuses every connection of one call: the endpoint went
    down mid-run. ``EndpointDownError`` (exit 1, a rerun resumes), latched: the next call
    raises it without sending, so the other chunks do not spend their own retries."""
    sent: list[int] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        raise httpx.ConnectError("Connection refused", request=request)

    client = make_embedder(Sequenced(ok, refuse, refuse, refuse), max_attempts=3)
    client.embed(["a"], idempotency_key=IDEM)
    with pytest.raises(EndpointDownError) as caught:
        client.embed(["a", SECRET_TEXT], idempotency_key=IDEM)
    assert len(sent) == 3 and caught.value.requests == 0  # refused: no request was sent
    assert "stopped accepting connections" in str(caught.value) and "rerun" in str(caught.value)
    assert_clean(str(caught.value))
    assert client.endpoint_down is caught.value and client.fatal_error is None
    with pytest.raises(EndpointDownError) as again:
        client.embed(["b"], idempotency_key=IDEM)
    assert len(sent) == 3 and again.value.message == caught.value.message
    assert isinstance(again.value, RetryableError)  # the run's kind: resumable, not fatal


@pytest.mark.parametrize(
    "exc_type",
    [httpx.ConnectTimeout, httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError],
)
def test_before_any_answer_only_refused_connections_mean_unreachable(
    exc_type: type[httpx.RequestError],
) -> None:
    """A wrong --base-url refuses connections (``ConnectError``); a timeout or a dropped
    connection may be a slow or overloaded server, so it stays retryable even first."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise exc_type("boom", request=request)

    error = embed_error(fail)
    assert type(error) is RetryableError and isinstance(error.__cause__, exc_type)


def test_refused_connections_before_any_answer_stop_the_client() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    error = embed_error(refuse)
    assert type(error) is FatalError, error
    assert "no request of this run ever reached it" in str(error)
    assert_clean(str(error))


def test_unsupported_protocol_is_fatal() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.UnsupportedProtocol("nope", request=request)

    assert isinstance(embed_error(handler), FatalError)


def test_local_protocol_error_is_fatal_and_not_chained() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.LocalProtocolError(f"Illegal header value b'Bearer {API_KEY}\\n'")

    error = embed_error(handler)
    assert isinstance(error, FatalError)
    assert error.__cause__ is None and error.__suppress_context__
    assert_clean(str(error))


# -- HTTP statuses --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 425, 500, 502, 503, 504])
def test_transient_statuses_are_retryable_with_retry_after(status: int) -> None:
    body = openai_error(None, type_="server_error")
    error = embed_error(answer(status, body, {"Retry-After": "7"}))
    assert type(error) is RetryableError
    assert error.http_status == status
    assert error.retry_after_s == 7.0


def test_429_is_rate_limited_with_the_servers_wait() -> None:
    body = openai_error("rate_limit_exceeded")
    error = embed_error(answer(429, body, {"retry-after-ms": "200"}))
    assert isinstance(error, RateLimitedError)
    assert error.http_status == 429
    assert error.retry_after_s == pytest.approx(0.2)


def test_429_without_headers_has_no_server_wait() -> None:
    error = embed_error(answer(429, openai_error("rate_limit_exceeded")))
    assert isinstance(error, RateLimitedError) and error.retry_after_s is None


@pytest.mark.parametrize(
    "body",
    [
        openai_error("insufficient_quota", type_="insufficient_quota"),
        openai_error(None, type_="insufficient_quota"),
        openai_error("insufficient_quota", type_="requests"),
    ],
)
def test_429_insufficient_quota_is_fatal_without_retry(body: dict[str, Any]) -> None:
    seq = Sequenced(answer(429, body, {"retry-after-ms": "10"}))
    error = embed_error(seq, max_attempts=5)
    assert isinstance(error, FatalError) and error.http_status == 429
    assert "insufficient_quota" in str(error)
    assert len(seq.requests) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_are_fatal_and_say_which_variable_to_set(status: int) -> None:
    # OpenAI's 401 message quotes part of the key: it must not reach our message
    body = openai_error("invalid_api_key", f"Incorrect API key provided: {API_KEY[:12]}***")
    error = embed_error(answer(status, body))
    assert isinstance(error, FatalError) and error.http_status == status
    assert "EMBEDLINE_API_KEY" in str(error) and "OPENAI_API_KEY" in str(error)
    assert API_KEY[:12] not in str(error)


def test_404_is_fatal_naming_model_and_path() -> None:
    error = embed_error(answer(404, openai_error("model_not_found", "The model does not exist")))
    assert isinstance(error, FatalError) and error.http_status == 404
    assert MODEL in str(error) and "/v1/embeddings" in str(error)
    assert "api.example.test" not in str(error)


@pytest.mark.parametrize("status", [400, 413, 422])
def test_rejections_are_row_errors_for_the_batch(status: int) -> None:
    seq = Sequenced(answer(status, openai_error(None, "'$.input' is invalid")))
    error = embed_error(seq, max_attempts=4)
    assert isinstance(error, RowError)
    assert error.reason == "rejected" and error.http_status == status
    assert len(seq.requests) == 1


def test_error_message_quoting_an_input_is_withheld() -> None:
    error = embed_error(answer(400, openai_error("bad_input", f"cannot embed '{SECRET_TEXT}'")))
    assert isinstance(error, RowError)
    assert "withheld" in str(error)
    assert_clean(str(error))


def test_long_error_messages_are_truncated() -> None:
    error = embed_error(answer(400, openai_error("x", "y" * 5000)))
    assert 150 < len(str(error)) < 300


@pytest.mark.parametrize(
    ("status", "body", "headers"),
    [
        (200, "<html><body>gateway</body></html>", {"Content-Type": "text/html"}),
        (200, "not json at all", {"Content-Type": "text/plain"}),
        (200, b"", None),
        (502, "<html>Bad Gateway</html>", {"Content-Type": "text/html"}),
        (418, "<html>I'm a teapot</html>", {"Content-Type": "text/html"}),
    ],
)
def test_html_or_non_json_bodies_are_retryable(status: int, body: Any, headers: Any) -> None:
    error = embed_error(answer(status, body, headers))
    assert type(error) is RetryableError and error.http_status == status


def test_other_4xx_with_json_is_fatal() -> None:
    error = embed_error(answer(418, openai_error("teapot")))
    assert isinstance(error, FatalError) and error.http_status == 418


def test_redirect_is_fatal() -> None:
    error = embed_error(answer(302, b"", {"Location": "https://elsewhere.test/v1/embeddings"}))
    assert isinstance(error, FatalError) and error.http_status == 302


def test_classify_reads_vllm_and_tei_error_shapes() -> None:
    vllm = {"object": "error", "message": "quota", "type": "insufficient_quota", "code": 429}
    tei = {"error": "Input validation error", "error_type": "Validation"}
    assert isinstance(classify(429, {}, vllm, model=MODEL, path="/v1/embeddings"), FatalError)
    error = classify(422, {}, tei, model=MODEL, path="/v1/embeddings")
    assert isinstance(error, RowError) and "Validation" in str(error)


def test_classify_returns_none_for_2xx_json() -> None:
    assert classify(200, {}, {"data": []}, model=MODEL, path="/v1/embeddings") is None


# -- response parsing -----------------------------------------------------------------------


def test_vectors_are_placed_by_index_not_position() -> None:
    emb = make_embedder(lambda r: httpx.Response(200, json=ok_body(r, order=[2, 0, 1])))
    result = emb.embed(["a", "b", "c"], idempotency_key=IDEM)
    np.testing.assert_array_equal(result.vectors, vectors_for(3))
    assert result.vectors.dtype == np.float32 and result.vectors.shape == (3, 4)


def test_base64_is_little_endian_float32() -> None:
    result = make_embedder(ok).embed(["a", "b"], idempotency_key=IDEM)
    np.testing.assert_array_equal(result.vectors, vectors_for(2))


def test_a_float_list_is_accepted_even_when_base64_was_asked() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = ok_body(request)
        for item in body["data"]:
            item["embedding"] = vectors_for(2)[item["index"]].tolist()
        return httpx.Response(200, json=body)

    result = make_embedder(handler).embed(["a", "b"], idempotency_key=IDEM)
    np.testing.assert_allclose(result.vectors, vectors_for(2))


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [({"prompt_tokens": 5, "total_tokens": 7}, 7), ({"prompt_tokens": 5}, 5), ({}, 0)],
)
def test_tokens_come_from_usage(usage: dict[str, int], tokens: int) -> None:
    emb = make_embedder(lambda r: httpx.Response(200, json=ok_body(r, usage=usage)))
    result = emb.embed(["a"], idempotency_key=IDEM)
    assert result.tokens == tokens and result.requests == 1


def _mutate(fn: Callable[[dict[str, Any]], Any]) -> Handler:
    """A 200 answer whose body ``fn`` breaks; plain json.dumps, so NaN/Infinity can be sent."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = ok_body(request)
        fn(body)
        content = json.dumps(body)
        return httpx.Response(200, content=content, headers={"Content-Type": "application/json"})

    return handler


def _set_item(index: int, key: str, value: Any) -> Handler:
    return _mutate(lambda body: body["data"][index].__setitem__(key, value))


def _b64(values: list[float]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


BAD_BODIES: dict[str, Handler] = {
    "no data": _mutate(lambda b: b.pop("data")),
    "payload is a list": lambda r: httpx.Response(200, json=[1, 2]),
    "too few": _mutate(lambda b: b["data"].pop()),
    "too many": _mutate(lambda b: b["data"].append(dict(b["data"][0], index=2))),
    "missing index, other out of range": _mutate(
        lambda b: (b["data"][0].pop("index"), b["data"][1].update(index=7))
    ),
    "bool index": _set_item(0, "index", True),
    "string index": _set_item(0, "index", "0"),
    "duplicate index": _set_item(1, "index", 0),
    "index out of range": _set_item(1, "index", 2),
    "negative index": _set_item(1, "index", -1),
    "unequal lengths": _set_item(1, "embedding", _b64([0.1, 0.2, 0.3])),
    "nan in base64": _set_item(0, "embedding", _b64([0.1, float("nan"), 0.3, 0.4])),
    "inf in base64": _set_item(0, "embedding", _b64([0.1, float("-inf"), 0.3, 0.4])),
    "nan in list": _set_item(0, "embedding", [0.1, float("nan"), 0.3, 0.4]),
    "inf in list": _set_item(0, "embedding", [0.1, float("inf"), 0.3, 0.4]),
    "overflow in list": _set_item(0, "embedding", [1e40, 0.2, 0.3, 0.4]),
    "null in list": _set_item(0, "embedding", [None, 0.2, 0.3, 0.4]),
    "not base64": _set_item(0, "embedding", "@@@@"),
    "partial float32": _set_item(0, "embedding", base64.b64encode(b"\x00" * 6).decode()),
    "nested list": _set_item(0, "embedding", [[0.1], [0.2]]),
    "text in list": _set_item(0, "embedding", [0.1, "x", 0.3, 0.4]),
    "number as embedding": _set_item(0, "embedding", 0.5),
    "missing embedding": _mutate(lambda b: b["data"][0].pop("embedding")),
    "empty embedding": _set_item(0, "embedding", []),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_malformed_2xx_is_a_bad_response(case: str) -> None:
    assert isinstance(embed_error(BAD_BODIES[case]), BadResponseError)


def _unpadded(mutate: Callable[[list[dict[str, Any]]], Any] = lambda data: None) -> Handler:
    """A 200 answer with 6-dimensional vectors (24 bytes: base64 without padding, which is
    decoded in one call for the whole answer), out of order, then ``mutate``d."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = ok_body(request, dims=6, order=[1, 0])
        mutate(body["data"])
        return httpx.Response(
            200, content=json.dumps(body), headers={"Content-Type": "application/json"}
        )

    return handler


def test_unpadded_base64_answers_decode_at_once_with_the_same_checks() -> None:
    result = make_embedder(_unpadded(), dimensions=6).embed(["a", "b"], idempotency_key=IDEM)
    np.testing.assert_array_equal(result.vectors, vectors_for(2, 6))
    assert result.vectors.flags.writeable and result.vectors.dtype == np.float32
    nan = _b64([0.1, float("nan"), 0.3, 0.4, 0.5, 0.6])
    bad = {
        "nan": lambda d: d[0].update(embedding=nan),
        "duplicate index": lambda d: d[1].update(index=d[0]["index"]),
        "unequal lengths": lambda d: d[0].update(embedding=_b64([0.1] * 9)),
        "not base64": lambda d: d[0].update(embedding="@" * 32),
    }
    for case, mutate in bad.items():
        assert isinstance(embed_error(_unpadded(mutate)), BadResponseError), case
    assert isinstance(embed_error(_unpadded(), dimensions=3), BadResponseError)


def test_wrong_dimensions_is_a_bad_response() -> None:
    assert isinstance(embed_error(ok, dimensions=8), BadResponseError)


def test_a_bad_200_is_retried_once_not_until_the_budget_is_spent() -> None:
    seq = Sequenced(BAD_BODIES["duplicate index"])
    slept: list[float] = []
    error = embed_error(seq, max_attempts=6, sleep=slept.append)
    assert isinstance(error, BadResponseError)
    assert len(seq.requests) == 2 and len(slept) == 1


# -- request shape --------------------------------------------------------------------------


def test_request_body_and_headers() -> None:
    seq = Sequenced(lambda r: httpx.Response(200, json=ok_body(r, dims=64)))
    make_embedder(seq, dimensions=64).embed(["a", "b"], idempotency_key=IDEM)
    request = seq.requests[0]
    assert request.method == "POST" and request.url.path == "/v1/embeddings"
    assert json.loads(request.content) == {
        "model": MODEL,
        "input": ["a", "b"],
        "encoding_format": "base64",
        "dimensions": 64,
    }
    assert request.headers["Idempotency-Key"] == IDEM
    assert request.headers["Authorization"] == f"Bearer {API_KEY}"


def test_no_dimensions_and_no_authorization_when_unset() -> None:
    seq = Sequenced(ok)
    make_embedder(seq, api_key=None).embed(["a"], idempotency_key=IDEM)
    assert "dimensions" not in json.loads(seq.requests[0].content)
    assert "Authorization" not in seq.requests[0].headers


def test_query_string_of_the_base_url_is_kept() -> None:
    seq = Sequenced(ok)
    url = "https://gw.test/openai/deployments/d?api-version=2024-02-01"
    emb = make_embedder(seq, base_url=url)
    emb.embed(["a"], idempotency_key=IDEM)
    assert seq.requests[0].url.path == "/openai/deployments/d/embeddings"
    assert seq.requests[0].url.params["api-version"] == "2024-02-01"


def test_refused_base64_switches_to_float_once_and_for_good() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["encoding_format"] == "base64":
            return httpx.Response(400, json=openai_error(None, "encoding_format: unknown value"))
        return ok(request)

    seq = Sequenced(handler)
    emb = make_embedder(seq, encoding_format="auto")
    first = emb.embed(["a", "b"], idempotency_key=IDEM)
    assert first.requests == 2 and emb.encoding_format == "float"
    np.testing.assert_allclose(first.vectors, vectors_for(2))
    assert emb.embed(["c"], idempotency_key=IDEM).requests == 1
    formats = [json.loads(r.content)["encoding_format"] for r in seq.requests]
    assert formats == ["base64", "float", "float"]


def test_format_fallback_is_not_repeated_when_float_is_refused_too() -> None:
    seq = Sequenced(answer(400, openai_error(None, "encoding_format not supported")))
    error = embed_error(seq, max_attempts=5, encoding_format="auto")
    assert isinstance(error, RowError)
    assert len(seq.requests) == 2


def _refuses_base64(status: int, body: Any) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["encoding_format"] == "base64":
            if isinstance(body, str):
                return httpx.Response(status, text=body)
            return httpx.Response(status, json=body)
        return ok(request)

    return handler


FASTAPI_422 = {
    "detail": [
        {
            "loc": ["body", "encoding_format"],
            "msg": "value is not a valid enumeration member; permitted: 'float'",
            "type": "type_error.enum",
        }
    ]
}


@pytest.mark.parametrize(
    "status, body",
    [
        (422, FASTAPI_422),
        (500, "Internal Server Error"),
        (500, {"detail": "something broke"}),
        (400, openai_error(None, "unsupported parameter")),
    ],
    ids=["fastapi-422", "plain-500", "json-500", "400-unnamed"],
)
def test_base64_refused_any_way_falls_back_to_float_once_for_the_run(
    status: int, body: Any, caplog: pytest.LogCaptureFixture
) -> None:
    seq = Sequenced(_refuses_base64(status, body))
    emb = make_embedder(seq, encoding_format="auto", max_attempts=6)
    with caplog.at_level(logging.WARNING, logger="embedline.http"):
        first = emb.embed(["a", "b"], idempotency_key=IDEM)
        second = emb.embed(["c"], idempotency_key=IDEM)
    np.testing.assert_allclose(first.vectors, vectors_for(2))
    assert (first.requests, second.requests) == (2, 1)
    formats = [json.loads(r.content)["encoding_format"] for r in seq.requests]
    assert formats == ["base64", "float", "float"]
    assert sum("encoding_format=base64" in r.getMessage() for r in caplog.records) == 1


def test_base64_is_kept_once_the_server_accepted_it() -> None:
    calls = Sequenced(ok, answer(500, "Internal Server Error"), ok)
    emb = make_embedder(calls, encoding_format="auto", max_attempts=2)
    emb.embed(["a"], idempotency_key=IDEM)
    emb.embed(["b"], idempotency_key=IDEM)
    formats = [json.loads(r.content)["encoding_format"] for r in calls.requests]
    assert formats == ["base64", "base64", "base64"] and emb.encoding_format == "base64"


def test_encoding_format_float_never_asks_for_base64() -> None:
    seq = Sequenced(ok)
    make_embedder(seq, encoding_format="float").embed(["a"], idempotency_key=IDEM)
    assert json.loads(seq.requests[0].content)["encoding_format"] == "float"


def test_a_fastapi_422_is_read_with_its_field() -> None:
    error = classify(422, {}, FASTAPI_422, model=MODEL, path="/v1/embeddings")
    assert isinstance(error, RowError) and "encoding_format: value is not" in str(error)


@pytest.mark.parametrize("missing", [[0], [0, 1, 2]], ids=["item 0", "every item"])
def test_a_missing_index_is_accepted_when_the_order_is_unambiguous(missing: list[int]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = ok_body(request)
        for i in missing:
            body["data"][i].pop("index")
        return httpx.Response(200, json=body)

    seq = Sequenced(handler)
    result = make_embedder(seq).embed(["a", "b", "c"], idempotency_key=IDEM)
    np.testing.assert_allclose(result.vectors, vectors_for(3))
    assert len(seq.requests) == 1


def test_two_of_three_indexes_missing_is_ambiguous() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = ok_body(request)
        for item in body["data"][:2]:
            item.pop("index")
        return httpx.Response(200, json=body)

    with pytest.raises(BadResponseError):
        make_embedder(handler).embed(["a", "b", "c"], idempotency_key=IDEM)


def test_a_200_error_body_shows_the_servers_message_redacted() -> None:
    body = {"error": {"message": f"upstream failed on {SECRET_TEXT}", "code": "upstream"}}
    seq = Sequenced(answer(200, {"error": {"message": "model overloaded", "code": "busy"}}))
    error = embed_error(seq, max_attempts=6)
    assert isinstance(error, BadResponseError) and "model overloaded" in str(error)
    assert len(seq.requests) == 2  # a bad 200 is retried once, not six times
    quoted = embed_error(Sequenced(answer(200, body)))
    assert "withheld" in str(quoted) and SECRET_TEXT not in str(quoted)


def test_auth_header_api_key_sends_the_bare_key_and_no_bearer() -> None:
    seq = Sequenced(ok)
    make_embedder(seq, auth_header="api-key").embed(["a"], idempotency_key=IDEM)
    assert seq.requests[0].headers["api-key"] == API_KEY
    assert "Authorization" not in seq.requests[0].headers


@pytest.mark.parametrize(
    "header, named", [("Authorization", "Authorization: Bearer"), ("api-key", "'api-key' header")]
)
def test_a_401_names_the_header_that_carried_the_key(header: str, named: str) -> None:
    body = openai_error("invalid_api_key", "Access denied due to invalid subscription key.")
    error = embed_error(answer(401, body), auth_header=header)
    assert isinstance(error, FatalError) and named in str(error)
    assert "--auth-header" in str(error) and API_KEY not in str(error)


def test_a_401_without_a_key_says_none_was_sent() -> None:
    error = embed_error(answer(401, openai_error("invalid_api_key", "no key")), api_key=None)
    assert "no API key was sent" in str(error)


def test_an_invalid_auth_header_name_is_an_input_error() -> None:
    with pytest.raises(InputError):
        make_embedder(ok, auth_header="api key")


def test_errors_carry_the_requests_they_cost() -> None:
    seq = Sequenced(answer(503, openai_error(None, "busy")))
    error = embed_error(seq, max_attempts=3)
    assert isinstance(error, RetryableError) and error.requests == 3


def test_empty_batch_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        make_embedder(ok).embed([], idempotency_key=IDEM)


# -- retries, pause, concurrency ------------------------------------------------------------


def test_retry_resends_the_same_idempotency_key() -> None:
    seq = Sequenced(answer(503, openai_error(None, type_="server_error")), ok)
    slept: list[float] = []
    emb = make_embedder(seq, max_attempts=3, sleep=slept.append)
    result = emb.embed(["a"], idempotency_key=IDEM)
    assert result.requests == 2 and len(slept) == 1
    assert [r.headers["Idempotency-Key"] for r in seq.requests] == [IDEM, IDEM]


def test_429_sleeps_the_servers_wait_once_then_pauses_other_calls() -> None:
    rate_limited = answer(429, openai_error("rate_limit_exceeded"), {"retry-after-ms": "500"})
    seq = Sequenced(rate_limited, ok)
    slept: list[float] = []
    emb = make_embedder(seq, max_attempts=3, sleep=slept.append)
    emb.embed(["a"], idempotency_key=IDEM)
    assert slept == [0.5]  # its own retry wait, not doubled by the shared pause
    other: list[float] = []
    emb._sleep = other.append  # another request of the same client, while the pause lasts
    emb.embed(["b"], idempotency_key=IDEM)
    assert len(other) == 1 and 0.2 < other[0] <= 0.5


def test_in_flight_requests_never_exceed_concurrency() -> None:
    lock = threading.Lock()
    state = {"now": 0, "max": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.03)
        with lock:
            state["now"] -= 1
        return ok(request)

    emb = make_embedder(handler, concurrency=2)
    threads = [
        threading.Thread(target=emb.embed, args=(["a"],), kwargs={"idempotency_key": IDEM})
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["max"] == 2


def test_concurrency_slot_is_free_during_backoff() -> None:
    free_while_sleeping: list[bool] = []
    holder: dict[str, OpenAIEmbedder] = {}

    def sleep(seconds: float) -> None:
        got = holder["emb"]._slots.acquire(blocking=False)
        free_while_sleeping.append(got)
        if got:
            holder["emb"]._slots.release()

    seq = Sequenced(answer(503, openai_error(None)), ok)
    holder["emb"] = make_embedder(seq, concurrency=1, max_attempts=2, sleep=sleep)
    holder["emb"].embed(["a"], idempotency_key=IDEM)
    assert free_while_sleeping == [True]


# -- RPM/TPM pacing -------------------------------------------------------------------------


class FakeClock:
    """Monotonic seconds that move only when the client sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def clocked(clock: FakeClock, handler: Handler) -> tuple[Handler, list[float]]:
    """Wrap ``handler`` to record the fake time at which each request is sent."""
    sent: list[float] = []

    def wrapped(request: httpx.Request) -> httpx.Response:
        sent.append(clock.now)
        return handler(request)

    return wrapped, sent


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_rpm_spaces_the_clients_requests_evenly() -> None:
    clock = FakeClock()
    handler, sent = clocked(clock, ok)
    emb = make_embedder(handler, rpm=120, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        emb.embed(["a"], idempotency_key=IDEM)
    assert gaps(sent) == pytest.approx([0.5] * 4)
    assert sent[0] == 100.0  # the first request waits for nothing


class RecordingPacer:
    """A pacer held elsewhere (a Dask cluster's budget): records what the client asks."""

    rpm: int | None = 60
    tpm: int | None = 6000
    enabled = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def reserve(self, tokens: int) -> float:
        self.calls.append(("reserve", tokens, 0))
        return 0.25

    def correct(self, *, estimated: int, used: int) -> None:
        self.calls.append(("correct", estimated, used))


def test_a_given_pacer_holds_the_limits_instead_of_the_clients_own() -> None:
    pacer = RecordingPacer()
    slept: list[float] = []
    emb = make_embedder(ok, pacer=pacer, sleep=slept.append)
    emb.embed(["x" * 30], idempotency_key=IDEM)  # estimate_tokens: 10
    assert pacer.calls[0] == ("reserve", 10, 0) and slept == [0.25]
    assert pacer.calls[1][:2] == ("correct", 10)  # the answer's usage, as for its own pacer
    assert (emb.rpm, emb.tpm) == (60, 6000)


def test_retries_are_paced_like_any_request() -> None:
    clock = FakeClock()
    busy = answer(503, openai_error(None), {"retry-after-ms": "1"})
    handler, sent = clocked(clock, Sequenced(busy, ok))
    emb = make_embedder(handler, rpm=60, clock=clock, sleep=clock.sleep, max_attempts=2)
    emb.embed(["a"], idempotency_key=IDEM)
    assert gaps(sent) == pytest.approx([1.0])  # not 1 ms: the retry is a request too


def test_tpm_books_the_estimate_then_credits_back_the_usage() -> None:
    clock = FakeClock()
    text = "x" * 300  # estimate_tokens: 100
    handler, sent = clocked(
        clock,
        lambda r: httpx.Response(
            200, json=ok_body(r, usage={"prompt_tokens": 20, "total_tokens": 20})
        ),
    )
    emb = make_embedder(handler, tpm=600, clock=clock, sleep=clock.sleep)  # 0.1 s/token
    emb.embed([text], idempotency_key=IDEM)
    emb.embed([text], idempotency_key=IDEM)
    assert gaps(sent) == pytest.approx([2.0])  # the 20 tokens used, not the 100 estimated


def test_tpm_debits_a_usage_above_the_estimate() -> None:
    clock = FakeClock()
    handler, sent = clocked(
        clock, lambda r: httpx.Response(200, json=ok_body(r, usage={"total_tokens": 50}))
    )
    emb = make_embedder(handler, tpm=600, clock=clock, sleep=clock.sleep)
    emb.embed(["abc"], idempotency_key=IDEM)  # estimated 1 token
    emb.embed(["abc"], idempotency_key=IDEM)
    assert gaps(sent) == pytest.approx([5.0])


def test_tpm_keeps_the_estimate_without_usage() -> None:
    clock = FakeClock()
    handler, sent = clocked(clock, lambda r: httpx.Response(200, json=ok_body(r, usage={})))
    emb = make_embedder(handler, tpm=600, clock=clock, sleep=clock.sleep)
    emb.embed(["x" * 30, "y" * 30], idempotency_key=IDEM)  # 10 + 10 tokens estimated
    emb.embed(["z"], idempotency_key=IDEM)
    assert gaps(sent) == pytest.approx([2.0])


def test_a_request_above_the_whole_tpm_is_sent_without_deadlock() -> None:
    clock = FakeClock()
    handler, sent = clocked(clock, lambda r: httpx.Response(200, json=ok_body(r, usage={})))
    emb = make_embedder(handler, tpm=100, clock=clock, sleep=clock.sleep)
    emb.embed(["x" * 3000], idempotency_key=IDEM)  # 1,000 tokens: ten minutes' allowance
    emb.embed(["y"], idempotency_key=IDEM)
    assert len(sent) == 2 and gaps(sent) == pytest.approx([600.0])


def test_waiting_for_the_pacer_holds_no_concurrency_slot() -> None:
    free_while_waiting: list[bool] = []
    holder: dict[str, OpenAIEmbedder] = {}

    def sleep(seconds: float) -> None:
        got = holder["emb"]._slots.acquire(blocking=False)
        free_while_waiting.append(got)
        if got:
            holder["emb"]._slots.release()

    holder["emb"] = make_embedder(ok, concurrency=1, rpm=60, sleep=sleep)
    holder["emb"].embed(["a"], idempotency_key=IDEM)
    holder["emb"].embed(["b"], idempotency_key=IDEM)
    assert free_while_waiting == [True]


def test_a_pause_that_starts_during_the_pacer_wait_is_honoured() -> None:
    clock = FakeClock()
    holder: dict[str, OpenAIEmbedder] = {}

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.slept) == 1:  # while this call waits for its start, a 429 pauses all
            holder["emb"]._pause.extend(5.0, http_status=429)

    handler, sent = clocked(clock, ok)
    holder["emb"] = make_embedder(handler, rpm=60, clock=clock, sleep=sleep)
    holder["emb"].embed(["a"], idempotency_key=IDEM)
    holder["emb"].embed(["b"], idempotency_key=IDEM)
    assert sent[1] - sent[0] >= 6.0  # its 1 s start, then the 5 s pause


# -- fatal latch ----------------------------------------------------------------------------

UNAUTHORIZED = answer(401, openai_error("invalid_api_key", "Incorrect API key provided"))


def test_after_a_fatal_answer_no_call_sends_anything() -> None:
    seq = Sequenced(UNAUTHORIZED, ok)
    emb = make_embedder(seq)
    with pytest.raises(FatalError) as first:
        emb.embed(["a"], idempotency_key=IDEM)
    for _ in range(3):
        with pytest.raises(FatalError) as later:
            emb.embed(["b"], idempotency_key=IDEM)
        assert later.value.http_status == 401
        assert "EMBEDLINE_API_KEY" in str(later.value)  # still says what to fix
    assert len(seq.requests) == 1
    assert emb.fatal_error is first.value


@pytest.mark.parametrize(
    "fatal",
    [
        answer(403, openai_error(None)),
        answer(404, openai_error("model_not_found")),
        answer(429, openai_error("insufficient_quota", type_="insufficient_quota")),
        answer(418, openai_error("teapot")),
    ],
    ids=["403", "404", "insufficient_quota", "other 4xx"],
)
def test_every_fatal_class_latches(fatal: Handler) -> None:
    seq = Sequenced(fatal, ok)
    emb = make_embedder(seq)
    for _ in range(2):
        with pytest.raises(FatalError):
            emb.embed(["a"], idempotency_key=IDEM)
    assert len(seq.requests) == 1


def test_a_fatal_transport_error_latches() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.UnsupportedProtocol("nope", request=request)

    emb = make_embedder(handler)
    for _ in range(2):
        with pytest.raises(FatalError):
            emb.embed(["a"], idempotency_key=IDEM)
    assert len(calls) == 1


def test_row_errors_and_retryable_errors_do_not_latch() -> None:
    seq = Sequenced(answer(400, openai_error(None)), answer(503, openai_error(None)), ok)
    emb = make_embedder(seq)
    with pytest.raises(RowError):
        emb.embed(["a"], idempotency_key=IDEM)
    with pytest.raises(RetryableError):
        emb.embed(["a"], idempotency_key=IDEM)
    assert emb.embed(["a"], idempotency_key=IDEM).requests == 1
    assert emb.fatal_error is None


def test_a_call_sleeping_in_backoff_raises_instead_of_resending() -> None:
    seq = Sequenced(answer(503, openai_error(None)), UNAUTHORIZED, ok)
    holder: dict[str, OpenAIEmbedder] = {}
    other: list[BaseException] = []

    def sleep(seconds: float) -> None:  # while the first call backs off, another gets a 401
        with pytest.raises(FatalError) as caught:
            holder["emb"].embed(["b"], idempotency_key=IDEM)
        other.append(caught.value)

    holder["emb"] = make_embedder(seq, max_attempts=5, sleep=sleep)
    with pytest.raises(FatalError) as woke:
        holder["emb"].embed(["a"], idempotency_key=IDEM)
    assert len(seq.requests) == 2 and other[0].http_status == 401
    # raised again unsent, with the first answer's message: the summary reads the same
    # whichever chunk reports first
    assert woke.value.http_status == 401 and woke.value is not other[0]
    assert str(woke.value) == str(other[0])


def test_a_call_waiting_for_the_pacer_raises_instead_of_sending() -> None:
    seq = Sequenced(ok, UNAUTHORIZED, ok)
    holder: dict[str, OpenAIEmbedder] = {}
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:  # the 2nd call waits for its start; a 3rd call gets the 401
            with pytest.raises(FatalError):
                holder["emb"].embed(["c"], idempotency_key=IDEM)

    holder["emb"] = make_embedder(seq, rpm=60, sleep=sleep)
    holder["emb"].embed(["a"], idempotency_key=IDEM)
    with pytest.raises(FatalError):
        holder["emb"].embed(["b"], idempotency_key=IDEM)
    assert len(seq.requests) == 2


def test_the_default_sleep_wakes_as_soon_as_the_client_is_stopped() -> None:
    seq = Sequenced(answer(503, openai_error(None), {"Retry-After": "30"}), UNAUTHORIZED)
    emb = make_embedder(seq, max_attempts=3, sleep=None)  # the real, interruptible sleep
    outcome: list[BaseException] = []

    def first() -> None:
        try:
            emb.embed(["a"], idempotency_key=IDEM)
        except BaseException as exc:  # noqa: BLE001 (handed to the test thread)
            outcome.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    deadline = time.monotonic() + 5
    while len(seq.requests) < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)  # the first call is now sleeping its 30 s
    started = time.monotonic()
    with pytest.raises(FatalError):
        emb.embed(["b"], idempotency_key=IDEM)
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - started < 2.0
    assert isinstance(outcome[0], FatalError) and len(seq.requests) == 2


def test_a_call_waiting_for_a_slot_checks_the_latch_before_sending() -> None:
    entered = threading.Event()
    release = threading.Event()
    count: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        count.append(1)
        if len(count) == 1:
            entered.set()
            release.wait(5)
            return UNAUTHORIZED(request)
        return ok(request)

    emb = make_embedder(handler, concurrency=1)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            emb.embed(["a"], idempotency_key=IDEM)
        except FatalError as exc:
            errors.append(exc)

    first = threading.Thread(target=call)
    first.start()
    entered.wait(5)
    second = threading.Thread(target=call)  # blocks on the one slot
    second.start()
    time.sleep(0.05)
    release.set()
    first.join(5)
    second.join(5)
    assert len(count) == 1 and len(errors) == 2


# -- server waits above the cap -------------------------------------------------------------


def test_classify_keeps_the_servers_whole_wait() -> None:
    error = classify(
        429,
        {"Retry-After": "600"},
        openai_error("rate_limit_exceeded"),
        model=MODEL,
        path="/v1/embeddings",
    )
    assert isinstance(error, RateLimitedError) and error.retry_after_s == 600.0


@pytest.mark.parametrize(
    ("status", "headers"),
    [
        (429, {"Retry-After": "600"}),
        (429, {"retry-after-ms": "600000"}),
        (503, {"Retry-After": "600"}),
    ],
)
def test_a_wait_above_the_cap_is_not_slept(status: int, headers: dict[str, str]) -> None:
    seq = Sequenced(answer(status, openai_error(None), headers), ok)
    slept: list[float] = []
    emb = make_embedder(seq, max_attempts=5, sleep=slept.append)
    with pytest.raises(RetryLaterError) as caught:
        emb.embed(["a", SECRET_TEXT], idempotency_key=IDEM)
    assert caught.value.retry_after_s == pytest.approx(600.0)
    assert caught.value.http_status == status
    assert len(seq.requests) == 1 and slept == []
    assert_clean(str(caught.value))


def test_an_http_date_above_the_cap_is_not_slept() -> None:
    from email.utils import formatdate

    later = formatdate(time.time() + 900, usegmt=True)
    seq = Sequenced(answer(429, openai_error(None), {"Retry-After": later}), ok)
    with pytest.raises(RetryLaterError) as caught:
        make_embedder(seq, max_attempts=5).embed(["a"], idempotency_key=IDEM)
    assert 880 < caught.value.retry_after_s <= 900  # type: ignore[operator]


def test_a_long_429_defers_every_call_of_the_client_while_it_lasts() -> None:
    clock = FakeClock()
    seq = Sequenced(answer(429, openai_error(None), {"Retry-After": "600"}), ok)
    emb = make_embedder(seq, max_attempts=5, clock=clock, sleep=clock.sleep)
    with pytest.raises(RetryLaterError):
        emb.embed(["a"], idempotency_key=IDEM)
    clock.now += 100.0
    with pytest.raises(RetryLaterError) as caught:  # 500 s left: still above the cap
        emb.embed(["b"], idempotency_key=IDEM)
    assert caught.value.retry_after_s == pytest.approx(500.0)
    assert caught.value.http_status == 429 and len(seq.requests) == 1
    clock.now += 400.0  # 100 s left: slept, then sent
    assert emb.embed(["c"], idempotency_key=IDEM).requests == 1
    assert clock.slept == [pytest.approx(100.0)] and len(seq.requests) == 2


def test_a_long_503_wait_defers_only_its_own_call() -> None:
    seq = Sequenced(answer(503, openai_error(None), {"Retry-After": "600"}), ok)
    emb = make_embedder(seq, max_attempts=5)
    with pytest.raises(RetryLaterError):
        emb.embed(["a"], idempotency_key=IDEM)
    assert emb.embed(["b"], idempotency_key=IDEM).requests == 1


@pytest.mark.parametrize(("max_wait_s", "deferred"), [(5.0, True), (10.0, False)])
def test_max_wait_s_is_the_cap(max_wait_s: float, deferred: bool) -> None:
    seq = Sequenced(answer(429, openai_error(None), {"Retry-After": "7"}), ok)
    slept: list[float] = []
    emb = make_embedder(seq, max_attempts=3, max_wait_s=max_wait_s, sleep=slept.append)
    if deferred:
        with pytest.raises(RetryLaterError):
            emb.embed(["a"], idempotency_key=IDEM)
        assert slept == [] and len(seq.requests) == 1
    else:
        assert emb.embed(["a"], idempotency_key=IDEM).requests == 2
        assert slept == [7.0]


def test_the_retry_policy_never_retries_retry_later() -> None:
    calls: list[int] = []
    slept: list[float] = []

    def fn() -> None:
        calls.append(1)
        raise RetryLaterError("later", http_status=429, retry_after_s=600.0)

    with pytest.raises(RetryLaterError):
        request_retrying(max_attempts=5, sleep=slept.append)(fn)
    assert len(calls) == 1 and slept == []


# -- logging --------------------------------------------------------------------------------


def test_one_info_per_call_one_warning_per_retry_and_no_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seq = Sequenced(answer(503, openai_error(None, f"overloaded; your input {SECRET_TEXT}")), ok)
    with caplog.at_level(logging.INFO, logger="embedline.http"):
        make_embedder(seq, max_attempts=2).embed(["a", SECRET_TEXT], idempotency_key=IDEM)
    ours = [r for r in caplog.records if r.name == "embedline.http"]
    assert [r.levelno for r in ours] == [logging.INFO, logging.WARNING, logging.INFO]
    assert "503" in ours[0].getMessage() and "200" in ours[2].getMessage()
    assert "503" in ours[1].getMessage()
    for record in ours:
        assert_clean(record.getMessage())


# -- construction, factory, helpers ---------------------------------------------------------


def test_repr_masks_the_key_and_url_password() -> None:
    emb = make_embedder(ok, base_url="https://user:hunter2@api.example.test/v1")
    assert API_KEY not in repr(emb) and "hunter2" not in repr(emb)
    assert "[secure]" in repr(emb)


@pytest.mark.parametrize("url", ["ftp://example.test/v1", "example.test/v1", "http://"])
def test_bad_base_url_is_an_input_error(url: str) -> None:
    with pytest.raises(InputError):
        make_embedder(ok, base_url=url)


@pytest.mark.parametrize("key", [API_KEY + "\n", "sk-é", "sk test"])
def test_api_key_with_unsendable_characters_is_fatal_and_not_echoed(key: str) -> None:
    with pytest.raises(FatalError) as caught:
        make_embedder(ok, api_key=key)
    assert key.strip() not in str(caught.value)


def test_api_key_from_env_prefers_embedline(monkeypatch: pytest.MonkeyPatch) -> None:
    assert api_key_from_env() is None
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert api_key_from_env() == "sk-openai"
    monkeypatch.setenv("EMBEDLINE_API_KEY", "sk-embedline")
    assert api_key_from_env() == "sk-embedline"
    monkeypatch.setenv("EMBEDLINE_API_KEY", "")
    assert api_key_from_env() == "sk-openai"


@pytest.mark.parametrize(
    ("text", "tokens"), [("", 1), ("abc", 1), ("abcd", 2), ("日本語", 3), ("a" * 300, 100)]
)
def test_estimate_tokens_is_utf8_bytes_over_three(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


@pytest.fixture
def fresh_cache() -> Any:
    close_embedders()
    yield
    close_embedders()


def settings(**overrides: Any) -> RunSettings:
    values: dict[str, Any] = {"input": "in.csv", "embedder": "openai", "base_url": BASE_URL}
    values.update(overrides)
    return RunSettings(**values)


def test_build_embedder_shares_one_client_per_configuration(fresh_cache: None) -> None:
    first = build_embedder(settings())
    assert build_embedder(settings()) is first
    assert build_embedder(settings(output="elsewhere")) is first  # not a client setting
    assert build_embedder(settings(timeout_s=5)) is not first
    assert build_embedder(settings(concurrency=2)) is not first
    assert build_embedder(settings(rpm=60)) is not first
    assert build_embedder(settings(tpm=10_000)) is not build_embedder(settings(tpm=20_000))
    close_embedders()
    assert build_embedder(settings()) is not first


def test_build_embedder_reads_the_key_from_the_environment(
    fresh_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBEDLINE_API_KEY", API_KEY)
    emb = build_embedder(settings())
    assert isinstance(emb, OpenAIEmbedder) and emb._api_key == API_KEY
    assert API_KEY not in repr(emb)


def test_build_embedder_warns_once_without_a_key(
    fresh_cache: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="embedline.http"):
        build_embedder(settings())
        build_embedder(settings(timeout_s=9))
    warnings = [r for r in caplog.records if "Authorization" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_local_embedder_rejects_other_dimensions_and_models(fresh_cache: None) -> None:
    with pytest.raises(ValueError, match="384"):  # settings refuse it before any work
        settings(embedder="local", dimensions=256)
    with pytest.raises(ValueError, match="--embedder openai"):
        settings(embedder="local", model="text-embedding-3-small")
    with pytest.raises(FatalError):
        LocalEmbedder(model="text-embedding-3-small")
    assert isinstance(build_embedder(settings(embedder="local", dimensions=384)), LocalEmbedder)


def test_openai_path_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "import adapters.embeddings as e\n"
        "from embedline.settings import RunSettings\n"
        "c = e.build_embedder(RunSettings(input='x.csv', embedder='openai'))\n"
        "local = e.LocalEmbedder()\n"  # constructing the local one is cheap too
        "assert type(c).__name__ == 'OpenAIEmbedder'\n"
        "bad = [m for m in ('torch', 'sentence_transformers', 'prefect') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('clean', e.__file__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("clean") and str(REPO) in done.stdout


def test_build_embedder_hands_rpm_and_tpm_to_the_client(fresh_cache: None) -> None:
    emb = build_embedder(settings(rpm=120, tpm=30_000))
    assert isinstance(emb, OpenAIEmbedder)
    assert (emb.rpm, emb.tpm) == (120, 30_000)
    assert emb.max_wait_s == 120.0
    unlimited = build_embedder(settings())
    assert isinstance(unlimited, OpenAIEmbedder) and (unlimited.rpm, unlimited.tpm) == (None, None)
