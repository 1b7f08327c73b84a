"""The progress model: rows/s over a recent window, the ETA it gives (a fake clock), and
the usage tally that keeps inputs charged apart from requests retried."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from embedline import progress
from embedline.errors import RateLimitedError
from embedline.progress import Throughput, Usage, duration_phrase


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_and_eta_come_from_the_rows_done_in_the_window() -> None:
    clock = Clock()
    rate = Throughput(window_s=60.0, clock=clock)
    assert rate.rows_per_s() is None and rate.eta_s(100) is None
    rate.observe(500)  # published before the run: no rate from them
    assert rate.rows_per_s() is None
    clock.now += 10
    rate.observe(1500)
    assert rate.rows_per_s() == pytest.approx(100.0)
    assert rate.eta_s(3500) == pytest.approx(20.0)
    assert rate.eta_s(1500) == 0.0


def test_the_rate_forgets_what_is_older_than_the_window() -> None:
    clock = Clock()
    rate = Throughput(window_s=60.0, clock=clock)
    rate.observe(0)
    for _ in range(12):  # 1,000 rows/s for two minutes
        clock.now += 10
        rate.observe(rate._seen[-1][1] + 10_000)
    for _ in range(7):  # then rate limited: 10 rows/s
        clock.now += 10
        rate.observe(rate._seen[-1][1] + 100)
    assert rate.rows_per_s() == pytest.approx(10.0, rel=0.01)
    clock.now += 10
    rate.observe(rate._seen[-1][1])  # stalled: the rate falls, the ETA grows
    assert rate.rows_per_s() == pytest.approx(500 / 60)  # the last 60 s: 5 x 100 rows, then 0


def test_no_rate_no_eta() -> None:
    clock = Clock()
    rate = Throughput(clock=clock)
    rate.observe(0)
    clock.now += 5
    rate.observe(0)
    assert rate.rows_per_s() == 0.0 and rate.eta_s(10) is None


def test_durations_read_as_a_person_says_them() -> None:
    assert duration_phrase(None) == "-"
    assert duration_phrase(42.4) == "42 s"
    assert duration_phrase(12 * 60) == "12 min"
    assert duration_phrase(3 * 3600 + 5 * 60) == "3 h 05 min"


class _Client:
    model, dimensions, whole_chunk, caps, accepted_requests = "m", 2, False, None, None

    def __init__(self, outcomes: list[object]) -> None:
        self.outcomes = outcomes

    def embed(self, texts: list[str], **kwargs: object) -> object:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_the_tally_keeps_inputs_charged_apart_from_requests_retried() -> None:
    """A call answered on its third attempt (two 429s) is charged for its texts once; a call
    that gave up after two 429s is charged nothing."""
    gave_up = RateLimitedError("429", retry_after_s=1.0)
    gave_up.requests, gave_up.inputs = 2, 8
    answered = SimpleNamespace(vectors=np.zeros((4, 2)), tokens=40, requests=3, inputs=12)
    client = progress.counting(_Client([answered, gave_up]), 0)  # type: ignore[arg-type]
    assert client is not None
    progress.reset_cost()
    try:
        client.embed(["a", "b", "c", "d"])
        with pytest.raises(RateLimitedError):
            client.embed(["e", "f", "g", "h"])
        assert progress.cost_in_process() == Usage(
            requests=5, tokens=40, inputs=4, requests_retried=4, inputs_retried=16
        )
    finally:
        progress.reset_cost()
