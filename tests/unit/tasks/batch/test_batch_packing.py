"""Many chunks' parts in one batch: parts packed whole within the limits, custom_ids that
name their chunk and part, each chunk's lines and answers taken back from a shared input or
result file (read once), a fresh ledger's adoption of a packed batch, and the ledger's
parts sharing one batch."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from adapters.ledger import Ledger
from embedline.keys import text_sha256
from embedline.models import ReusePlan, Row
from embedline.settings import RunSettings
from tasks.batch.calls import BatchCalls, batch_metadata
from tasks.batch.outputs import OutputLines
from tasks.batch.records import all_answered, batch_counts, batch_requests, token_cap
from tasks.batch.requests import (
    BatchResults,
    chunk_requests,
    input_file,
    layout_from_input,
    layout_of,
    pack_parts,
    split_input,
    split_wire_id,
    wire_id,
)
from tests.unit.tasks.batch.test_batch_requests import output_line, vec

SETTINGS = RunSettings(input="in.csv", embedder="openai", batch_api=True, batch_size=2)
RUN = "r" * 64


def chunk_rows(chunk: int, n: int = 3) -> list[Row]:
    texts = [f"chunk {chunk} text {i}" for i in range(n)]
    return [Row(i + 1, i + 2, f"c{chunk}-{i}", t, text_sha256(t)) for i, t in enumerate(texts)]


def requests_of(chunk: int, n: int = 3) -> Any:
    return chunk_requests(chunk_rows(chunk, n), ReusePlan(), SETTINGS)


def test_parts_are_packed_whole_within_max_inputs_and_the_token_budget() -> None:
    parts = [requests_of(c) for c in range(5)]  # 3 inputs each, in 2 requests
    assert pack_parts(parts, SETTINGS) == [(0, 5)]  # one batch for all five chunks
    capped = SETTINGS.model_copy(update={"batch_max_inputs": 7})
    assert pack_parts(parts, capped) == [(0, 2), (2, 4), (4, 5)]  # never a part split
    tokens = sum(r.estimated_tokens for r in parts[0])
    assert pack_parts(parts, SETTINGS, max_tokens=tokens * 3) == [(0, 3), (3, 5)]
    lone = SETTINGS.model_copy(update={"batch_max_inputs": 1})
    assert pack_parts(parts[:2], lone) == [(0, 1), (1, 2)]  # a part over a limit goes alone


def test_a_custom_id_names_its_chunk_and_part_and_a_plain_one_names_none() -> None:
    key = requests_of(0)[0].custom_id
    assert split_wire_id(wire_id(812, 3, key)) == (812, 3, key)
    assert split_wire_id(key) is None  # a batch made before parts were packed
    assert split_wire_id("12.x.abc") is None


def test_a_packed_input_file_splits_back_by_chunk_and_part_with_plain_custom_ids() -> None:
    a, b = requests_of(4), requests_of(5)
    content = input_file([(4, 0, a), (5, 1, b)], SETTINGS)
    lines = content.splitlines()
    ids = [json.loads(line)["custom_id"] for line in lines]
    assert len(set(ids)) == len(ids) == 4 and ids[0] == wire_id(4, 0, a[0].custom_id)
    split = split_input(content + lines[0].replace(b"4.0.", b"") + b"\n")
    assert set(split) == {4, 5, None} and set(split[4]) == {0} and set(split[5]) == {1}
    assert layout_from_input(chunk_rows(5), split[5][1], SETTINGS) == layout_of(b)
    assert layout_from_input(chunk_rows(4), split[4][0], SETTINGS) == layout_of(a)
    assert layout_from_input(chunk_rows(4), split[5][1], SETTINGS) == ()  # other rows


def test_a_chunk_reads_only_its_own_answers_from_a_shared_result_file() -> None:
    a, b = requests_of(1), requests_of(2)
    content = output_line(wire_id(1, 0, a[0].custom_id), [vec(0), vec(1)]) + output_line(
        wire_id(2, 0, a[0].custom_id),
        [vec(8), vec(9)],  # the same key in another chunk
    )
    results = BatchResults()
    results.add_output(content, dimensions=None, chunk=1)
    assert set(results.vectors) == {a[0].custom_id}
    np.testing.assert_array_equal(results.vectors[a[0].custom_id][0][0], vec(0))
    assert b  # chunk 2's answer is not read by chunk 1


def test_a_shared_result_file_is_read_once_and_each_chunk_gets_its_lines() -> None:
    content = b"\n".join(
        [
            b'{"custom_id": "1.0.aa", "response": {}}',
            b'{"custom_id":"2.0.bb","response":{}}',
            b'{"custom_id": "cc", "response": {}}',  # names no chunk: every chunk's
        ]
    )
    reads: list[str] = []

    def read(file_id: str) -> bytes:
        reads.append(file_id)
        return content

    outputs = OutputLines()
    one = outputs.lines(read, "http://a", "file-1", 1)
    two = outputs.lines(read, "http://a", "file-1", 2)
    assert reads == ["file-1"]
    assert b"1.0.aa" in one and b"2.0.bb" not in one and b'"cc"' in one
    assert b"2.0.bb" in two and b"1.0.aa" not in two
    outputs.lines(read, "http://b", "file-1", 1)  # another provider's file of the same id
    outputs.lines(read, "http://a", "file-1", 1)  # a chunk asking again (a retried task)
    assert reads == ["file-1"] * 3


class Listing:
    """A Batch API client that lists (newest first) and serves input files, counting."""

    def __init__(self, batches: list[dict[str, Any]], files: dict[str, bytes]) -> None:
        self.batches, self.files, self.reads = batches, files, 0

    def list_batches(self) -> Any:
        return iter(self.batches)

    def file_content(self, file_id: str) -> bytes:
        self.reads += 1
        return self.files[file_id]


def test_a_fresh_ledger_adopts_a_packed_batch_for_each_chunk_its_lines_name() -> None:
    specs = [SimpleNamespace(index=i, key=f"{i}" * 64) for i in range(4)]
    content = input_file([(1, 0, requests_of(1)), (2, 0, requests_of(2))], SETTINGS)
    packed = {
        "id": "b1",
        "status": "completed",
        "input_file_id": "file-in",
        "created_at": int(time.time() - 60),
        "request_counts": {"total": 4, "completed": 4, "failed": 0},
        "metadata": batch_metadata(RUN, [(specs[1], 0), (specs[2], 0)]),  # type: ignore[list-item]
    }
    assert packed["metadata"] == {"embedline_run": RUN, "embedline_chunks": "1-2"}
    client = Listing([packed], {"file-in": content})
    ledger = Ledger(":memory:")
    calls = BatchCalls(client, ledger, RUN, logging.getLogger("test"))  # type: ignore[arg-type]
    assert calls.unrecorded(specs[0]) == {}  # outside its chunk range: not read
    assert client.reads == 0
    assert calls.unrecorded(specs[1]) == {0: packed}
    assert calls.unrecorded(specs[2]) == {0: packed}
    assert client.reads == 1  # read once for both chunks
    lines = calls.input_of(packed, 2, 0)
    assert layout_from_input(chunk_rows(2), lines, SETTINGS) == layout_of(requests_of(2))
    # once chunk 1 records it, only chunk 1 stops finding it
    ledger.add_batch_parts(RUN, 1, specs[1].key, [(0, 0, 2, layout_of(requests_of(1)))])
    ledger.mark_batch_submitted(RUN, 1, 0, batch_id="b1", input_file_id="file-in", status="x")
    assert calls.unrecorded(specs[1]) == {} and calls.unrecorded(specs[2]) == {0: packed}
    assert calls.find(specs[3], 5, "file-in") is packed  # by its upload, whatever the part


def test_the_parts_a_batch_packs_share_its_id_polls_and_count_as_one_batch() -> None:
    ledger = Ledger(":memory:")  # 0013_packed_batches: a batch id is no longer unique in a run
    for chunk in (7, 8):
        ledger.add_batch_parts(RUN, chunk, "k" * 64, [(0, 0, 2, layout_of(requests_of(chunk)))])
        ledger.mark_batch_submitted(
            RUN, chunk, 0, batch_id="b1", input_file_id="f1", status="in_progress"
        )
    ledger.update_batch(
        RUN,
        "b1",
        status="completed",
        output_file_id="o1",
        error_file_id=None,
        completed=4,
        failed=0,
    )
    records = ledger.run_batches(RUN)
    assert [(r.idx, r.status, r.output_file_id, r.requests) for r in records] == [
        (7, "completed", "o1", 2),
        (8, "completed", "o1", 2),
    ]
    totals = batch_requests(records)
    assert totals == {"b1": 4}
    assert all(all_answered(r, totals["b1"]) for r in records)
    assert not all_answered(records[0])  # the part's own 2 requests are not the batch's 4
    # `embedline status RUN`: one line a part, done/total both the whole batch's
    from cli.batches import batch_lines

    assert [line.split("\t")[4] for line in batch_lines(ledger, RUN)] == [
        "requests=4/4 failed=0",
        "requests=4/4 failed=0",
    ]
    (count,) = batch_counts(records)
    assert (count.status, count.batches, count.requests, count.completed) == (
        "completed",
        1,
        4,
        4,
    )


def test_a_token_limit_refusal_caps_the_batches_packed_after_it() -> None:
    stated = "Enqueued token limit reached for m. Limit: 3,000,000 enqueued tokens. Please …"
    assert token_cap(stated, 5_000_000, None) == 3_000_000  # the limit the message states
    assert token_cap(stated, None, 1_000) == 1_000  # never above the cap learned so far
    assert token_cap("token_limit_exceeded", 800, None) == 400  # no limit stated: half
    assert token_cap("token_limit_exceeded", None, 400) == 200  # refused again: half again
    assert token_cap("token_limit_exceeded", None, None) is None  # nothing to learn from
