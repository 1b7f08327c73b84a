"""embedline.retry: Retry-After parsing, the wait strategy and the request policy."""

from __future__ import annotations

import calendar
import random

import pytest
from tenacity import RetryCallState, Retrying

from embedline.errors import (
    BadResponseError,
    FatalError,
    RateLimitedError,
    RetryableError,
    RowError,
)
from embedline.retry import (
    MAX_RETRY_AFTER_S,
    WaitRetryAfter,
    parse_retry_after,
    request_retrying,
)

# 2026-10-21 07:27:57 UTC, three seconds before the RFC 9110 example date below.
NOW = float(calendar.timegm((2026, 10, 21, 7, 27, 57)))


# -- parse_retry_after --------------------------------------------------------------------


def test_http_date_three_seconds_ahead_gives_three_seconds() -> None:
    wait = parse_retry_after({"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, now=NOW)
    assert wait == pytest.approx(3.0)


def test_http_date_in_the_past_gives_zero() -> None:
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    ["Wednesday, 21-Oct-26 07:28:00 GMT", "Wed Oct 21 07:28:00 2026"],  # RFC 850, asctime
)
def test_obsolete_http_date_forms_are_accepted(value: str) -> None:
    assert parse_retry_after({"Retry-After": value}, now=NOW) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("value", "expected"), [("1.5", 1.5), ("3", 3.0), (" 7 ", 7.0), ("0", 0.0)]
)
def test_delay_seconds_integer_or_fractional(value: str, expected: float) -> None:
    assert parse_retry_after({"Retry-After": value}) == expected


def test_retry_after_ms_is_milliseconds() -> None:
    assert parse_retry_after({"retry-after-ms": "200"}) == pytest.approx(0.2)


def test_retry_after_ms_wins_over_retry_after() -> None:
    assert parse_retry_after({"Retry-After": "30", "retry-after-ms": "1500"}) == pytest.approx(1.5)


def test_unparseable_retry_after_ms_falls_back_to_retry_after() -> None:
    assert parse_retry_after({"retry-after-ms": "soon", "Retry-After": "2"}) == 2.0


def test_header_names_are_case_insensitive() -> None:
    assert parse_retry_after({"RETRY-AFTER": "4"}) == 4.0
    assert parse_retry_after({"Retry-After-Ms": "250"}) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "value", ["soon", "", "-1", "nan", "inf", "1e3", "٣", "Wed, 99 Oct 2026 07:28:00 GMT"]
)
def test_unparseable_values_give_none(value: str) -> None:
    assert parse_retry_after({"Retry-After": value}, now=NOW) is None


def test_no_header_gives_none() -> None:
    assert parse_retry_after({"Content-Type": "application/json"}) is None


def test_long_waits_are_clamped_to_the_cap() -> None:
    assert parse_retry_after({"Retry-After": "3600"}) == MAX_RETRY_AFTER_S
    assert parse_retry_after({"Retry-After": "90"}, max_wait_s=60.0) == 60.0


# -- WaitRetryAfter -------------------------------------------------------------------------


def make_retry_state(exc: BaseException, attempt_number: int = 1) -> RetryCallState:
    """A state whose last attempt raised ``exc`` (like tenacity's tests' make_retry_state)."""
    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt_number
    state.set_exception((type(exc), exc, None))
    return state


class FixedWait:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.seconds


def test_wait_uses_the_servers_retry_after() -> None:
    wait = WaitRetryAfter(FixedWait(9.0))  # type: ignore[arg-type]
    assert wait(make_retry_state(RateLimitedError("429", retry_after_s=3.0))) == 3.0


def test_wait_falls_back_without_retry_after() -> None:
    wait = WaitRetryAfter(FixedWait(9.0))  # type: ignore[arg-type]
    assert wait(make_retry_state(RetryableError("503"))) == 9.0
    assert wait(make_retry_state(BadResponseError("count"))) == 9.0


def test_wait_clamps_the_servers_wait() -> None:
    wait = WaitRetryAfter(FixedWait(1.0), max_wait_s=120.0)  # type: ignore[arg-type]
    assert wait(make_retry_state(RetryableError("503", retry_after_s=500.0))) == 120.0
    assert wait(make_retry_state(RetryableError("503", retry_after_s=-4.0))) == 0.0


@pytest.mark.parametrize("attempt", [1, 2, 3, 6, 10])
def test_backoff_is_full_jitter_within_the_window(attempt: int) -> None:
    random.seed(attempt)
    policy = request_retrying(max_attempts=10, backoff_base_s=0.5, backoff_cap_s=4.0)
    state = make_retry_state(RetryableError("reset"), attempt_number=attempt)
    waits = [policy.wait(state) for _ in range(200)]
    window = min(4.0, 0.5 * 2 ** (attempt - 1))
    assert all(0.0 <= w <= window for w in waits)
    assert max(waits) > window / 2  # spread over the window, not a fixed delay


# -- request_retrying -----------------------------------------------------------------------


class Flaky:
    """Raises the given errors in order, then returns "ok"; counts calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_retryable_errors_are_retried_with_recorded_sleeps() -> None:
    slept: list[float] = []
    policy = request_retrying(max_attempts=3, sleep=slept.append)
    fn = Flaky(RetryableError("503"), BadResponseError("count"))
    assert policy(fn) == "ok"
    assert fn.calls == 3
    assert len(slept) == 2


def test_rate_limit_sleeps_what_the_server_said() -> None:
    slept: list[float] = []
    policy = request_retrying(max_attempts=3, sleep=slept.append)
    fn = Flaky(RateLimitedError("429", http_status=429, retry_after_s=0.2))
    assert policy(fn) == "ok"
    assert slept == [0.2]


@pytest.mark.parametrize("error", [FatalError("401"), RowError("rejected"), ValueError("bug")])
def test_other_errors_are_not_retried(error: BaseException) -> None:
    slept: list[float] = []
    fn = Flaky(error)
    with pytest.raises(type(error)):
        request_retrying(max_attempts=5, sleep=slept.append)(fn)
    assert fn.calls == 1
    assert slept == []


def test_attempts_count_the_first_try_and_reraise_our_error() -> None:
    slept: list[float] = []
    last = RetryableError("503 again", http_status=503)
    fn = Flaky(RetryableError("503"), RetryableError("503"), last, RetryableError("unused"))
    with pytest.raises(RetryableError) as caught:
        request_retrying(max_attempts=3, sleep=slept.append)(fn)
    assert caught.value is last  # not tenacity.RetryError
    assert fn.calls == 3
    assert len(slept) == 2


def test_before_sleep_sees_the_upcoming_wait() -> None:
    seen: list[tuple[int, float]] = []
    policy = request_retrying(
        max_attempts=2,
        sleep=lambda s: None,
        before_sleep=lambda st: seen.append((st.attempt_number, st.upcoming_sleep)),
    )
    policy(Flaky(RetryableError("503", retry_after_s=1.25)))
    assert seen == [(1, 1.25)]


def test_copy_with_recorded_sleep_as_in_the_style_guide() -> None:
    slept: list[float] = []
    policy = request_retrying(max_attempts=2).copy(sleep=slept.append)
    policy(Flaky(RetryableError("503", retry_after_s=0.5)))
    assert slept == [0.5]


def test_zero_attempts_is_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        request_retrying(max_attempts=0)
