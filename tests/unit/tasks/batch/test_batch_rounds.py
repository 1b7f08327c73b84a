"""The Batch API stage's rules that make it always end: custom_ids unique by construction
(a split request and its retries), parts fitted to the enqueued-token budget, when
unanswered requests are submitted again (``tasks.batch.rounds.Rounds``), and the token-limit
backoff that resets after progress (``TokenBackoff``)."""

from __future__ import annotations

import json

import pytest

from embedline.errors import FatalError
from embedline.models import ReusePlan
from tasks.batch import rounds
from tasks.batch.requests import BatchResults, chunk_requests, fit, input_file, pack, unique
from tests.unit.tasks.batch.test_batch_requests import SETTINGS, output_line, rows, vec


def test_a_split_request_and_its_retried_singles_are_pending_once_each() -> None:
    # part 0: [good, flaky] refused whole (400); part 1: its singles, flaky a 500: the
    # chunk's requests list the pair and the singles; each single is pending once
    pair = chunk_requests(rows(["refused", "flaky"]), ReusePlan(), SETTINGS)[0]
    refused, flaky = pair.singles()
    results = BatchResults()
    results.add_output(output_line(pair.custom_id, [], status=400), dimensions=None)
    results.add_output(
        output_line(refused.custom_id, [], status=400)
        + output_line(flaky.custom_id, [], status=500),
        dimensions=None,
    )
    resolved = results.resolve([pair, refused, flaky])
    assert [r.custom_id for r in resolved.pending] == [flaky.custom_id]  # before: twice
    assert resolved.errored == {flaky.custom_id}  # the server ran it and failed


def test_an_input_file_never_repeats_a_custom_id() -> None:
    requests = chunk_requests(rows(["a", "b", "c"]), ReusePlan(), SETTINGS)
    content = input_file([(0, 1, [*requests, requests[0]]), (1, 1, requests)], SETTINGS)
    ids = [json.loads(line)["custom_id"] for line in content.splitlines()]
    assert len(ids) == len(set(ids)) == 2 * len(requests)  # a chunk's part: its own ids
    assert unique([*requests, requests[0]]) == requests


def test_a_request_over_the_token_budget_is_split_into_its_inputs() -> None:
    requests = chunk_requests(rows(["x" * 30, "y" * 30, "z" * 30]), ReusePlan(), SETTINGS)
    assert [len(r.texts) for r in requests] == [2, 1]  # 10 estimated tokens per input
    fitted = fit(requests, max_tokens=15)
    assert [len(r.texts) for r in fitted] == [1, 1, 1]
    assert [r.texts for r in fitted] == [("x" * 30,), ("y" * 30,), ("z" * 30,)]
    assert pack(fitted, SETTINGS, max_tokens=15) == [(0, 1), (1, 2), (2, 3)]
    assert fit(requests, max_tokens=None) == requests  # no budget known: as they are
    assert fit(requests, max_tokens=25) == requests  # each fits


def test_inputs_answered_alone_answer_the_request_they_were_split_from() -> None:
    pair = chunk_requests(rows(["a", "b"]), ReusePlan(), SETTINGS)[0]
    first, second = pair.singles()
    results = BatchResults()
    results.add_output(output_line(first.custom_id, [vec(0)]), dimensions=None)
    resolved = results.resolve([pair, first, second])
    assert [r.custom_id for r in resolved.pending] == [second.custom_id]
    assert len(resolved.vectors) == 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_expired_requests_are_submitted_again_while_the_window_lasts_and_once_per_run() -> None:
    clock = Clock()
    run = rounds.Rounds(clock)
    assert all(run.again(0, pending=3, errored=0) for _ in range(50))  # no count limit
    clock.now = rounds.COMPLETION_WINDOW_S
    assert not run.again(0, pending=3, errored=0)  # the window has ended
    assert run.again(1, pending=3, errored=0)  # a chunk not submitted again yet: once
    assert not run.again(1, pending=3, errored=0)
    rerun = rounds.Rounds(clock)  # a rerun: a window of its own
    assert rerun.again(0, pending=3, errored=0)
    assert not run.again(2, pending=0, errored=0)  # nothing unanswered


def test_server_errors_are_submitted_again_a_bounded_number_of_times_per_run() -> None:
    run = rounds.Rounds(Clock())
    tries = [run.again(0, pending=2, errored=2) for _ in range(rounds.MAX_ERROR_ROUNDS + 2)]
    assert tries == [True] * rounds.MAX_ERROR_ROUNDS + [False, False]
    assert run.again(0, pending=2, errored=1)  # one expired among them: the window rules
    assert rounds.Rounds(Clock()).again(0, pending=2, errored=2)  # a rerun tries again


def test_the_token_backoff_doubles_resets_after_progress_and_ends_within_the_window() -> None:
    clock = Clock()
    backoff = rounds.TokenBackoff(1.0, clock)
    assert [backoff.refused(in_flight=True) for _ in range(3)] == [1.0, 2.0, 4.0]
    assert backoff.delay() == 4.0
    backoff.progress()
    assert backoff.refused(in_flight=True) == 1.0  # before: 8.0, and never back
    assert backoff.refused(in_flight=False) == 0.0  # nothing of ours to wait for
    assert backoff.delay() == 0.0
    clock.now = rounds.COMPLETION_WINDOW_S
    with pytest.raises(FatalError, match="--batch-enqueued-tokens"):
        backoff.refused(in_flight=True)


def test_messages_name_the_command_that_finishes_the_run() -> None:
    assert "--batch-fallback sync" in rounds.unanswered_message(3)
    why = rounds.unfittable_message("batch_1", 4, "token_limit_exceeded: Limit: 3")
    assert "--batch-fallback sync" in why and "enqueued-token limit" in why and "chunk 4" in why
