"""adapters.embeddings.openai_batch without sockets (httpx.MockTransport): what a 404 means
for each Batch API path, and an endpoint that refuses every connection, classified as the
synchronous client classifies it (exit 3 before any answer, exit 1 after one)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from adapters.embeddings.openai_batch import BatchClient
from embedline.errors import EndpointDownError, FatalError, RetryableError, UnknownBatchError

Handler = Callable[[httpx.Request], httpx.Response]


def _client(handler: Handler, *, max_attempts: int = 2) -> tuple[BatchClient, list[str]]:
    sent: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        return handler(request)

    client = BatchClient(
        base_url="http://batch.test/v1",
        api_key="sk-secret",
        max_attempts=max_attempts,
        sleep=lambda s: None,
        client=httpx.Client(transport=httpx.MockTransport(record)),
    )
    return client, sent


def _not_found(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        404,
        json={"error": {"message": "No batch found with id 'b'.", "type": "invalid_request_error"}},
    )


def test_a_404_for_a_recorded_batch_or_file_names_it_and_says_what_to_do() -> None:
    client, _ = _client(_not_found)
    for call, attribute, value in (
        (lambda: client.get_batch("batch_abc"), "batch_id", "batch_abc"),
        (lambda: client.cancel_batch("batch_abc"), "batch_id", "batch_abc"),
        (lambda: client.file_content("file-xyz"), "file_id", "file-xyz"),
    ):
        with pytest.raises(UnknownBatchError) as caught:
            call()
        error = caught.value
        assert getattr(error, attribute) == value and error.exit_code == 3
        assert (
            f"{'batch' if attribute == 'batch_id' else 'file'} {value} is unknown to "
            "http://batch.test/v1 (HTTP 404)" in str(error)
        )
        assert "the API key and --base-url that created it" in str(error)
        assert "sk-secret" not in str(error) and "\n" not in str(error)
        assert "check --model" not in str(error)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.upload("in.jsonl", b"{}\n"),
        lambda c: c.create_batch("file-1", {}),
        lambda c: list(c.list_batches()),
    ],
    ids=["upload", "create", "list"],
)
def test_a_404_for_the_collections_is_a_server_without_a_batch_api(
    call: Callable[[BatchClient], object],
) -> None:
    client, _ = _client(_not_found)
    with pytest.raises(FatalError) as caught:
        call(client)
    assert not isinstance(caught.value, UnknownBatchError)
    assert "has no Batch API" in str(caught.value) and "without --batch-api" in str(caught.value)


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def test_nothing_listening_is_fatal_and_later_calls_are_not_sent() -> None:
    client, sent = _client(_refused, max_attempts=3)
    with pytest.raises(FatalError) as caught:
        client.upload("in.jsonl", b"{}\n")
    assert "no request of this run ever reached it" in str(caught.value)
    assert "check that the server is running and --base-url is right" in str(caught.value)
    assert len(sent) == 3  # its attempts, then the breaker is open
    with pytest.raises(FatalError):
        client.get_batch("batch_abc")
    assert len(sent) == 3


def test_an_endpoint_that_went_down_after_answering_is_an_outage_not_fatal() -> None:
    answers: list[Handler] = [lambda r: httpx.Response(200, json={"id": "file-1"})]

    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)(request) if answers else _refused(request)

    client, _ = _client(handler)
    assert client.upload("in.jsonl", b"{}\n") == "file-1"
    with pytest.raises(RetryableError) as created:  # a create is sent once: not an outage
        client.create_batch("file-1", {})
    assert not isinstance(created.value, EndpointDownError)
    with pytest.raises(EndpointDownError) as caught:
        client.get_batch("batch_abc")
    assert "stopped accepting connections" in str(caught.value)
