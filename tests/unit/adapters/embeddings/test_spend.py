"""``SpendCap`` (``--max-cost``): requests in flight count against the cap, so concurrent
requests never pass it together; a failed answer is not billed; the refusal says what was
spent, what is left and how to go on."""

from __future__ import annotations

import pytest

from adapters.embeddings.spend import SpendCap
from embedline.errors import CostCapError


def test_a_request_that_would_pass_the_cap_is_refused_counting_those_in_flight() -> None:
    cap = SpendCap(max_cost=100.0, price_per_million=1e6)  # one USD per token
    cap.book(60)
    with pytest.raises(CostCapError):
        cap.book(41)  # 60 in flight + 41 > 100, though nothing is spent yet
    cap.book(40)
    cap.settle(60, 30)  # billed less than estimated: the rest is free again
    cap.settle(40, None)  # a failed answer: not billed
    assert cap.tokens == 30
    cap.book(70)


def test_an_answer_without_usage_counts_its_estimate() -> None:
    cap = SpendCap(max_cost=10.0, price_per_million=1e6)
    cap.book(8)
    cap.settle(8, 0)
    assert cap.spent == 8.0


def test_the_refusal_says_what_was_spent_what_is_left_and_how_to_go_on() -> None:
    cap = SpendCap(max_cost=0.5, price_per_million=20_000.0)
    cap.book(20)
    cap.settle(20, 20)  # $0.40
    with pytest.raises(CostCapError) as refused:
        cap.book(10)
    message = str(refused.value)
    assert "$0.40 spent" in message and "$0.10 left" in message
    assert "rerun with a higher --max-cost" in message
    assert refused.value.exit_code == 3
