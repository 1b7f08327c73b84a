"""Batch API mode, pure parts: a chunk's requests and custom_ids, parts within the limits,
results matched by custom_id whatever their order, rejections isolated, the answering
client; and the ledger's ``batches`` table."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from adapters.ledger import Ledger
from embedline.errors import RetryableError, RowError
from embedline.keys import request_key, row_key, text_sha256
from embedline.models import ReusePlan, ReuseSource, Row
from embedline.protocols import Embeddings
from embedline.settings import RunSettings
from tasks.batch.answers import BatchAnswers
from tasks.batch.requests import (
    BatchResults,
    chunk_requests,
    input_file,
    layout_from_input,
    layout_of,
    layout_requests,
    pack,
)
from tasks.embed.rows import embed_rows

SETTINGS = RunSettings(input="in.csv", embedder="openai", batch_api=True, batch_size=2)
MODEL = SETTINGS.effective_model


def rows(texts: list[str]) -> list[Row]:
    return [Row(i + 1, i + 2, f"id{i}", t, text_sha256(t)) for i, t in enumerate(texts)]


def vec(i: int, d: int = 4) -> np.ndarray:
    return np.full(d, float(i + 1), dtype=np.float32)


def output_line(
    custom_id: str, vectors: list[np.ndarray], tokens: int = 3, status: int = 200
) -> bytes:
    body: dict[str, object] = {
        "object": "list",
        "model": MODEL,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode(),
            }
            for i, v in enumerate(vectors)
        ],
    }
    if status != 200:
        body = {"error": {"message": "The input was rejected.", "type": "invalid_request_error"}}
    return (
        json.dumps(
            {
                "id": "r",
                "custom_id": custom_id,
                "error": None,
                "response": {"status_code": status, "body": body},
            }
        ).encode()
        + b"\n"
    )


def test_custom_ids_are_the_synchronous_idempotency_keys() -> None:
    chunk = rows(["a a", "b", "", "a a", "c", "d"])  # empty and in-chunk duplicate not sent
    requests = chunk_requests(chunk, ReusePlan(), SETTINGS)
    assert [r.texts for r in requests] == [("a a", "b"), ("c", "d")]

    seen: list[str] = []

    class Recorder:
        caps = None
        whole_chunk = False
        accepted_requests = 1

        def embed(self, texts: list[str], *, idempotency_key: str, **_: object) -> Embeddings:
            seen.append(idempotency_key)
            return Embeddings(np.ones((len(texts), 4), dtype=np.float32))

    sendable = [chunk[0], chunk[1], chunk[2], chunk[4], chunk[5]]
    embed_rows(
        sendable,
        Recorder(),
        model=MODEL,
        dimensions=None,
        batch_size=2,  # type: ignore[arg-type]
        max_request_tokens=200_000,
    )
    assert [r.custom_id for r in requests] == seen
    keys = [
        row_key("id0", text_sha256("a a"), MODEL, None),
        row_key("id1", text_sha256("b"), MODEL, None),
    ]
    assert requests[0].custom_id == request_key(keys)


def test_rows_the_reuse_plan_covers_are_not_requested() -> None:
    chunk = rows(["a", "b", "c"])
    plan = ReusePlan((ReuseSource("chunks/x.parquet", (0, 2)),))
    assert [r.texts for r in chunk_requests(chunk, plan, SETTINGS)] == [("b",)]


def test_parts_respect_max_inputs_and_the_token_budget() -> None:
    requests = chunk_requests(rows([f"text {i}" for i in range(10)]), ReusePlan(), SETTINGS)
    capped = SETTINGS.model_copy(update={"batch_max_inputs": 4})
    assert pack(requests, capped) == [(0, 2), (2, 4), (4, 5)]
    budget = requests[0].estimated_tokens * 2
    assert pack(requests, SETTINGS, max_tokens=budget) == [(0, 2), (2, 4), (4, 5)]
    assert pack(requests, SETTINGS) == [(0, 5)]
    line = json.loads(input_file([(7, 1, requests[:1])], SETTINGS))
    assert line["custom_id"] == f"7.1.{requests[0].custom_id}"  # chunk 7, part 1
    assert line["url"] == "/v1/embeddings" and line["method"] == "POST"
    assert line["body"]["input"] == ["text 0", "text 1"]


def test_results_are_matched_by_custom_id_not_by_order() -> None:
    requests = chunk_requests(rows(["a", "b", "c", "d"]), ReusePlan(), SETTINGS)
    results = BatchResults()
    # reversed order, in two files
    results.add_output(output_line(requests[1].custom_id, [vec(2), vec(3)]), dimensions=None)
    results.add_output(
        output_line(requests[0].custom_id, [vec(0), vec(1)], tokens=5), dimensions=None
    )
    resolved = results.resolve(requests)
    assert not resolved.pending and not resolved.rejected
    for i, text in enumerate("abcd"):
        np.testing.assert_array_equal(resolved.vectors[text_sha256(text)][0], vec(i))
    assert resolved.vectors[text_sha256("a")][1] + resolved.vectors[text_sha256("b")][1] == 5


def test_rejected_request_is_sent_again_input_by_input_then_dead_letters_one() -> None:
    requests = chunk_requests(rows(["good", "bad"]), ReusePlan(), SETTINGS)
    results = BatchResults()
    results.add_output(output_line(requests[0].custom_id, [], status=400), dimensions=None)
    first = results.resolve(requests)
    assert [p.texts for p in first.pending] == [("good",), ("bad",)]  # one input each
    good, bad = first.pending
    results.add_output(
        output_line(good.custom_id, [vec(0)]) + output_line(bad.custom_id, [], status=400),
        dimensions=None,
    )
    second = results.resolve(requests)
    assert not second.pending
    assert second.rejected[text_sha256("bad")][0] == 400
    client = BatchAnswers(second, model=MODEL, dimensions=None)
    with pytest.raises(RowError):
        client.embed(["good", "bad"], idempotency_key="k")
    assert client.embed(["good"], idempotency_key="k").vectors.shape == (1, 4)
    assert client.accepted_requests == 2  # an input's rejection, not the request's


def test_expired_and_server_errors_are_pending_and_only_they() -> None:
    requests = chunk_requests(rows(["a", "b", "c", "d"]), ReusePlan(), SETTINGS)
    results = BatchResults()
    expired = json.dumps(
        {
            "id": "r",
            "custom_id": requests[1].custom_id,
            "response": None,
            "error": {"code": "batch_expired", "message": "expired"},
        }
    ).encode()
    results.add_output(
        output_line(requests[0].custom_id, [vec(0), vec(1)]) + b"\n" + expired, dimensions=None
    )
    assert [p.custom_id for p in results.resolve(requests).pending] == [requests[1].custom_id]
    results = BatchResults()
    results.add_output(output_line(requests[0].custom_id, [], status=500), dimensions=None)
    assert len(results.resolve(requests).pending) == 2


def test_answers_send_only_what_no_batch_answered_to_the_fallback() -> None:
    requests = chunk_requests(rows(["a", "b"]), ReusePlan(), SETTINGS)
    results = BatchResults()
    results.add_output(output_line(requests[0].custom_id, [vec(0), vec(1)]), dimensions=None)
    sent: list[list[str]] = []

    class Sync:
        accepted_requests = 1

        def embed(self, texts: list[str], **_: object) -> Embeddings:
            sent.append(list(texts))
            return Embeddings(
                np.zeros((len(texts), 4), dtype=np.float32), tokens=7, requests=1, inputs=len(texts)
            )

    client = BatchAnswers(
        results.resolve(requests), model=MODEL, dimensions=None, fallback=lambda: Sync()
    )  # type: ignore[arg-type,return-value]
    answer = client.embed(["a", "new", "b"], idempotency_key="k")
    assert sent == [["new"]] and answer.requests == 1
    assert answer.inputs == 3  # two answered by the batch, one sent synchronously
    np.testing.assert_array_equal(answer.vectors[2], vec(1))
    assert client.batch_tokens == 3 and answer.tokens == 10
    without = BatchAnswers(results.resolve(requests), model=MODEL, dimensions=None)
    with pytest.raises(RetryableError, match="no answer"):
        without.embed(["new"], idempotency_key="k")


def test_ledger_records_batches_before_and_after_create() -> None:
    ledger = Ledger(":memory:")
    first_layout = (("a" * 64, (0, 1)), ("b" * 64, (2, 3)))
    ledger.add_batch_parts(
        "r" * 64, 3, "c" * 64, [(0, 0, 2, first_layout), (1, 2, 3, (("d" * 64, (4, 5)),))]
    )
    ledger.add_batch_parts("r" * 64, 3, "c" * 64, [(0, 0, 9, ())])  # kept as it was
    parts = ledger.run_batches("r" * 64, 3)
    assert [(p.part, p.state, p.req_stop, p.batch_id, p.requests, p.inputs) for p in parts] == [
        (0, "creating", 2, None, 2, 4),
        (1, "creating", 3, None, 1, 2),
    ]
    assert parts[0].layout == first_layout  # what the part carries, as recorded
    ledger.mark_batch_submitted(
        "r" * 64, 3, 0, batch_id="batch_1", input_file_id="file_1", status="validating"
    )
    ledger.update_batch(
        "r" * 64,
        "batch_1",
        status="completed",
        output_file_id="file_2",
        error_file_id=None,
        completed=2,
        failed=0,
    )
    first = ledger.run_batches("r" * 64)[0]
    assert (first.state, first.status, first.output_file_id, first.completed) == (
        "submitted",
        "completed",
        "file_2",
        2,
    )
    ledger.drop_batch_part("r" * 64, 3, 0)  # submitted: never dropped
    ledger.drop_batch_part("r" * 64, 3, 1)
    assert [p.part for p in ledger.run_batches("r" * 64)] == [0]


def test_recorded_layouts_answer_the_rows_whatever_the_batching_settings_now() -> None:
    chunk = rows(["a", "b", "c", "d", "e"])
    submitted = chunk_requests(chunk, ReusePlan(), SETTINGS)  # batch size 2: 3 requests
    layout = layout_of(submitted)
    assert layout[0] == (submitted[0].custom_id, (0, 1))
    rerun = SETTINGS.model_copy(update={"batch_size": 3, "batch_max_inputs": 2})
    assert [r.custom_id for r in chunk_requests(chunk, ReusePlan(), rerun)] != [
        r.custom_id for r in submitted
    ]  # the rerun would batch them otherwise
    rebuilt = layout_requests(chunk, layout, rerun)
    assert [(r.custom_id, r.texts) for r in rebuilt] == [(r.custom_id, r.texts) for r in submitted]
    results = BatchResults()
    for i, request in enumerate(submitted):
        results.add_output(
            output_line(request.custom_id, [vec(2 * i + j) for j in range(len(request.texts))]),
            dimensions=None,
        )
    client = BatchAnswers(results.resolve(rebuilt), model=MODEL, dimensions=None)
    answer = client.embed(["e", "c", "a", "b", "d"], idempotency_key="other batching")
    np.testing.assert_array_equal(answer.vectors[:, 0], [5, 3, 1, 2, 4])
    assert answer.requests == 0 and answer.inputs == 5
    # a layout that does not describe these rows (another row at a position) matches none
    edited = rows(["a", "B", "c", "d", "e"])
    assert [r.custom_id for r in layout_requests(edited, layout, rerun)] == [
        submitted[1].custom_id,
        submitted[2].custom_id,
    ]
    assert layout_requests(chunk, ((submitted[0].custom_id, (0, 9)),), rerun) == []


def test_only_rows_at_given_positions_are_requested() -> None:
    chunk = rows(["a", "b", "c", "d"])
    requests = chunk_requests(chunk, ReusePlan(), SETTINGS, only={1, 3})
    assert [(r.texts, r.rows) for r in requests] == [(("b", "d"), (1, 3))]


def test_a_batch_found_at_the_provider_is_matched_by_its_input_file_exactly() -> None:
    """A fresh ledger's run adopts a batch by the requests its input file carries: each line
    mapped to the rows whose keys make its custom_id, whatever settings built it; a line of
    other rows (an edited text, a duplicate text on another id) maps to none of them."""
    chunk = rows(["a", "b", "c", "d", "e"])
    other = SETTINGS.model_copy(update={"batch_size": 3})
    submitted = chunk_requests(chunk, ReusePlan(), other)  # what a lost ledger's run sent
    content = input_file([(0, 0, submitted)], other)
    assert layout_from_input(chunk, content, SETTINGS) == layout_of(submitted)
    edited = rows(["a", "b", "c", "D", "e"])  # row 3 changed since: its request is left out
    assert layout_from_input(edited, content, SETTINGS) == layout_of(submitted[:1])
    # the same text on two ids: the row whose id made the custom_id, not the first one
    twins = [*rows(["x", "y"]), Row(3, 4, "twin", "x", text_sha256("x"))]
    (single,) = chunk_requests(twins[2:], ReusePlan(), SETTINGS)
    layout = layout_from_input(twins, input_file([(0, 0, [single])], SETTINGS), SETTINGS)
    assert layout == ((single.custom_id, (2,)),)
    # another model's batch answers none of these rows
    large = SETTINGS.model_copy(update={"model": "text-embedding-3-large"})
    large_requests = chunk_requests(chunk, ReusePlan(), large)
    assert layout_from_input(chunk, input_file([(0, 0, large_requests)], large), SETTINGS) == ()
    assert layout_from_input(chunk, b"not json\n{}\n", SETTINGS) == ()
