"""embed_rows: empty texts, batching, bisection of rejected rows, poison rows vs outages."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from embedline.errors import RetryableError, RowError, StopRequestedError
from embedline.keys import request_key, row_key, text_sha256
from embedline.models import Row
from embedline.protocols import EmbeddingClientBase, Embeddings
from embedline.shutdown import STOP
from tasks.embed.rows import batches, embed_rows


class ScriptedClient(EmbeddingClientBase):
    """An EmbeddingClient whose answer depends on the texts sent; records every call."""

    model = "m"
    dimensions = 3

    def __init__(self, fail: Callable[[Sequence[str]], Exception | None] = lambda t: None):
        self.fail = fail
        self.calls: list[tuple[list[str], str]] = []
        self.expected: list[int | None] = []  # expect_dimensions of each call

    def embed(
        self, texts: Sequence[str], *, idempotency_key: str, expect_dimensions: int | None = None
    ) -> Embeddings:
        self.calls.append((list(texts), idempotency_key))
        self.expected.append(expect_dimensions)
        error = self.fail(texts)
        if error is not None:
            raise error
        vectors = np.array([[len(t), 1.0, 0.0] for t in texts], dtype=np.float32)
        return Embeddings(vectors=vectors, tokens=len(texts), requests=1)

    def close(self) -> None:
        pass


def _rows(texts: list[str]) -> list[Row]:
    return [Row(i + 1, i + 2, f"id{i}", t, text_sha256(t)) for i, t in enumerate(texts)]


def _run(rows: list[Row], client: ScriptedClient, **kw: object):  # type: ignore[no-untyped-def]
    options = {"model": "m", "dimensions": None, "batch_size": 4, "max_request_tokens": 10**6}
    return embed_rows(rows, client, **{**options, **kw})  # type: ignore[arg-type]


def test_empty_and_whitespace_texts_are_dead_letters_never_sent() -> None:
    client = ScriptedClient()
    result = _run(_rows(["a", "", "  \n\t", "b"]), client)
    assert [d.reason for d in result.dead_letters] == ["empty_text", "empty_text"]
    assert [d.id for d in result.dead_letters] == ["id1", "id2"]
    assert [t for texts, _ in client.calls for t in texts] == ["a", "b"]
    assert [r.id for r in result.rows] == ["id0", "id3"]


def test_requests_carry_the_documented_idempotency_key() -> None:
    client = ScriptedClient()
    rows = _rows(["a", "b"])
    _run(rows, client)
    expected = request_key([row_key(r.id, r.text_sha256, "m", None) for r in rows])
    assert client.calls[0][1] == expected


def test_batches_respect_size_and_token_budget() -> None:
    rows = _rows(["x" * 30, "y" * 30, "z" * 30, "w"])  # 10 estimated tokens each, then 1
    assert [len(b) for b in batches(rows, batch_size=3, max_request_tokens=1000)] == [3, 1]
    assert [len(b) for b in batches(rows, batch_size=10, max_request_tokens=20)] == [2, 2]
    one_big = _rows(["x" * 300])
    assert [len(b) for b in batches(one_big, batch_size=10, max_request_tokens=5)] == [1]


def test_rejected_row_is_isolated_by_bisection_and_the_rest_embedded() -> None:
    def fail(texts: Sequence[str]) -> Exception | None:
        return RowError("rejected", http_status=400) if "bad" in texts else None

    client = ScriptedClient(fail)
    texts = ["a", "b", "c", "bad", "e", "f", "g", "h"]
    result = _run(_rows(texts), client, batch_size=8)
    assert [(d.id, d.reason, d.http_status) for d in result.dead_letters] == [
        ("id3", "rejected", 400)
    ]
    assert [r.id for r in result.rows] == [f"id{i}" for i in range(8) if i != 3]
    np.testing.assert_array_equal(result.vectors[:, 0], [1.0] * 7)
    assert ["bad"] in [texts for texts, _ in client.calls]  # isolated alone
    assert len(client.calls) <= 1 + 2 * 3  # log2(8) levels, two calls each


def test_repeated_500_on_one_row_is_isolated_as_server_error() -> None:
    def fail(texts: Sequence[str]) -> Exception | None:
        return RetryableError("500", http_status=500) if "poison" in texts else None

    client = ScriptedClient(fail)
    result = _run(_rows(["a", "b", "poison", "d"]), client)
    assert [(d.id, d.reason, d.http_status) for d in result.dead_letters] == [
        ("id2", "server_error", 500)
    ]
    assert len(result.rows) == 3


def test_outage_fails_the_chunk_instead_of_dead_lettering_rows() -> None:
    client = ScriptedClient(lambda texts: RetryableError("500", http_status=500))
    with pytest.raises(RetryableError):
        _run(_rows(["a", "b", "c", "d"]), client)
    assert len(client.calls) == 3  # the batch, then both halves: no deeper


def test_503_is_not_bisected() -> None:
    client = ScriptedClient(lambda texts: RetryableError("503", http_status=503))
    with pytest.raises(RetryableError):
        _run(_rows(["a", "b"]), client)
    assert len(client.calls) == 1


def test_too_long_text_is_dead_lettered_before_sending() -> None:
    client = ScriptedClient()
    result = _run(_rows(["short", "x" * 41]), client, max_input_tokens=10)
    assert [(d.id, d.reason) for d in result.dead_letters] == [("id1", "too_long")]
    assert [t for texts, _ in client.calls for t in texts] == ["short"]


def test_truncate_sends_the_text_as_read_which_reading_has_cut() -> None:
    """The cut happens when the chunk is read (``InputSource.truncate_bytes``), so the text
    sent is the row's, and its hash is the hash of what is sent."""
    client = ScriptedClient()
    rows = _rows(["é" * 15, "short"])  # 30 bytes: as read with --max-input-tokens 10
    result = _run(rows, client, max_input_tokens=10, on_too_long="truncate")
    assert client.calls[0][0] == ["é" * 15, "short"]
    assert result.rows[0].text_sha256 == text_sha256("é" * 15)
    assert result.dead_letters == []


def test_stop_request_releases_before_the_next_request() -> None:
    client = ScriptedClient()
    STOP.dispatch.stop_tasks()
    try:
        with pytest.raises(StopRequestedError):
            _run(_rows(["a", "b"]), client)
    finally:
        STOP.start_dispatching()  # clears the stop
    assert client.calls == []


def test_every_request_after_the_first_answer_expects_its_length() -> None:
    client = ScriptedClient()
    _run(_rows([f"text {i}" for i in range(10)]), client)
    assert client.expected == [None, 3, 3]  # batches of 4: learned from the first answer


def test_the_runs_length_given_by_the_flow_is_expected_from_the_first_request() -> None:
    client = ScriptedClient()
    _run(_rows([f"text {i}" for i in range(6)]), client, expect_dimensions=3)
    assert client.expected == [3, 3]


def test_a_chunk_with_nothing_to_send_needs_no_client() -> None:
    """Every row reused: the chunk task builds no client (a crash-resume test found
    ``'NoneType' object has no attribute 'caps'`` once ``caps`` was read, not probed)."""
    result = embed_rows(
        [], None, model="m", dimensions=None, batch_size=4, max_request_tokens=10**6
    )
    assert (result.rows, result.dead_letters, result.requests) == ([], [], 0)


def test_only_answers_that_report_usage_add_to_the_calibration_estimate() -> None:
    class Unmetered(ScriptedClient):
        """Reports usage only for requests whose first text starts with "metered"."""

        def embed(
            self,
            texts: Sequence[str],
            *,
            idempotency_key: str,
            expect_dimensions: int | None = None,
        ) -> Embeddings:
            answer = super().embed(texts, idempotency_key=idempotency_key)
            metered = texts[0].startswith("metered")
            return Embeddings(answer.vectors, tokens=answer.tokens if metered else 0, requests=1)

    texts = ["metered one, two", "metered three", "plain four five", "plain six"]
    result = _run(_rows(texts), Unmetered(), batch_size=2)
    assert result.tokens == 2  # the scripted client's usage: one token per text
    assert result.tokens_estimated == 4 + 2  # approximate_tokens of the metered request only
