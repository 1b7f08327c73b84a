"""adapters.rate_limit: even RPM/TPM pacing, token weights, usage corrections, oversize
requests and thread-safety, on a fake clock (no sockets, no real sleeping but one test)."""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from adapters.rate_limit import GCRA, RequestPacer


class FakeClock:
    """A monotonic clock that only moves when ``sleep`` (or ``advance``) is called."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


def send(pacer: RequestPacer, clock: FakeClock, tokens: int = 1) -> float:
    """Book one request, sleep the wait as a client does; return when it starts."""
    clock.sleep(pacer.reserve(tokens))
    return clock.now


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, so races show up."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def max_in_window(starts: list[float], window_s: float) -> int:
    """The most request starts inside any half-open window of ``window_s`` seconds."""
    starts = sorted(starts)
    best, lo = 0, 0
    for hi, start in enumerate(starts):
        while start - starts[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


# -- requests per minute --------------------------------------------------------------------


def test_rpm_120_starts_a_request_every_half_second() -> None:
    clock = FakeClock()
    pacer = RequestPacer(rpm=120, clock=clock)
    t0 = clock.now
    starts = [send(pacer, clock) - t0 for _ in range(8)]
    assert starts == pytest.approx([0.5 * k for k in range(8)])


def test_no_burst_of_a_minutes_allowance_after_idle_time() -> None:
    clock = FakeClock()
    pacer = RequestPacer(rpm=60, clock=clock)
    send(pacer, clock)
    clock.advance(3600.0)  # an hour idle: still only one request may go at once
    assert pacer.reserve(0) == 0.0
    assert pacer.reserve(0) == pytest.approx(1.0)
    assert pacer.reserve(0) == pytest.approx(2.0)


def test_rate_is_never_exceeded_over_any_window() -> None:
    clock = FakeClock()
    pacer = RequestPacer(rpm=600, clock=clock)
    starts = []
    for _ in range(200):
        clock.advance(random.Random(len(starts)).uniform(0, 0.15))  # irregular demand
        starts.append(send(pacer, clock))
    for window_s in (0.1, 0.5, 1.0, 6.0):
        assert max_in_window(starts, window_s) <= round(window_s * 10) + 1


def test_without_limits_nothing_waits() -> None:
    pacer = RequestPacer(clock=FakeClock())
    assert not pacer.enabled
    assert [pacer.reserve(10**9) for _ in range(5)] == [0.0] * 5
    pacer.correct(estimated=10, used=99)  # no TPM: no effect, no error


@pytest.mark.parametrize("limit", [0, -5])
def test_limits_below_one_are_refused(limit: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        GCRA(limit)
    with pytest.raises(ValueError):
        RequestPacer(rpm=limit)


# -- tokens per minute ----------------------------------------------------------------------


def test_tpm_spaces_requests_by_their_token_weights() -> None:
    clock = FakeClock()
    pacer = RequestPacer(tpm=600, clock=clock)  # 10 tokens/s: 0.1 s per token
    t0 = clock.now
    starts = [send(pacer, clock, tokens) - t0 for tokens in (5, 20, 1, 30, 2)]
    assert starts == pytest.approx([0.0, 0.5, 2.5, 2.6, 5.6])


def test_rpm_and_tpm_together_wait_for_the_later_of_the_two() -> None:
    clock = FakeClock()
    pacer = RequestPacer(rpm=60, tpm=6000, clock=clock)  # 1 request/s, 100 tokens/s
    t0 = clock.now
    starts = [send(pacer, clock, tokens) - t0 for tokens in (50, 500, 10, 10)]
    # 2nd: RPM (1 s) is later than TPM (0.5 s); 3rd: TPM (1 + 5 s); 4th: RPM again
    assert starts == pytest.approx([0.0, 1.0, 6.0, 7.0])


def test_an_over_estimate_is_credited_back_to_the_next_request() -> None:
    clock = FakeClock()
    pacer = RequestPacer(tpm=600, clock=clock)
    assert pacer.reserve(100) == 0.0  # booked 10 s of tokens
    pacer.correct(estimated=100, used=20)  # the server counted 20: 2 s
    assert pacer.reserve(1) == pytest.approx(2.0)


def test_an_under_estimate_is_debited_from_the_next_request() -> None:
    clock = FakeClock()
    pacer = RequestPacer(tpm=600, clock=clock)
    pacer.reserve(10)
    pacer.correct(estimated=10, used=35)
    assert pacer.reserve(1) == pytest.approx(3.5)


def test_a_credit_never_builds_up_a_burst() -> None:
    clock = FakeClock()
    pacer = RequestPacer(tpm=600, clock=clock)
    pacer.reserve(100)
    clock.advance(1.0)
    pacer.correct(estimated=100, used=1)  # would move the next start to 0.1 s: the past
    assert pacer.reserve(10) == 0.0
    assert pacer.reserve(10) == pytest.approx(1.0)  # paced by the first one's 10 tokens


def test_late_credits_arriving_together_never_start_a_burst() -> None:
    """Ten requests in flight (a Dask cluster's threads, two workers of five), each booked at
    its estimate of 10 tokens and using 6. An answer's credit rides on its worker's next
    reservation; once a thread has no more to send, its credit waits for another thread of
    its worker, so two to four credits land at once on bookings already queued. Counted at
    the tokens they use, the requests starting within any second stay within one second's
    worth, and the budget is still used (the requests go 0.2 s apart: 6 tokens at 30/s)."""
    clock = FakeClock()
    pacer = RequestPacer(tpm=1800, clock=clock)  # 30 tokens a second
    left = [5, 5, 5, 5, 10, 5, 5, 5, 5, 10]  # requests to send, per thread
    carried = [0, 0]  # answers whose credit waits for the worker's next reservation
    starts = {thread: clock.now + pacer.reserve(10) for thread in range(10)}
    sent: list[float] = []
    while starts:
        thread = min(starts, key=lambda t: (starts[t], t))
        clock.now = starts.pop(thread)
        sent.append(clock.now)  # answered at once
        left[thread] -= 1
        carried[thread // 5] += 1
        if left[thread]:
            answers, carried[thread // 5] = carried[thread // 5], 0
            pacer.correct(estimated=10 * answers, used=6 * answers)
            starts[thread] = clock.now + pacer.reserve(10)
    assert len(sent) == 60
    assert max_in_window(sent, 1.0) * 6 <= 30  # one second's worth: 5 requests of 6
    steady = [s for s in sorted(sent) if s >= sent[0] + 4.0]  # once the credits flow
    assert 60 * 6 * (len(steady) - 1) / (steady[-1] - steady[0]) >= 0.99 * 1800


def test_a_request_above_the_whole_tpm_goes_when_the_limiter_is_idle() -> None:
    clock = FakeClock()
    pacer = RequestPacer(tpm=600, clock=clock)
    pacer.reserve(10)  # 1 s booked
    wait = pacer.reserve(1200)  # two minutes' allowance in one request: no deadlock
    assert wait == pytest.approx(1.0)  # it goes once the earlier booking has elapsed
    assert pacer.reserve(1) == pytest.approx(1.0 + 120.0)  # the next one pays for it


def test_an_oversize_request_on_an_idle_limiter_goes_at_once() -> None:
    clock = FakeClock()
    pacer = RequestPacer(rpm=10, tpm=100, clock=clock)
    assert pacer.reserve(10_000) == 0.0


# -- threads --------------------------------------------------------------------------------


def test_eight_threads_never_share_a_slot_or_exceed_the_rate(fast_switching: None) -> None:
    clock = FakeClock()  # frozen: a start is exactly the wait returned
    pacer = RequestPacer(rpm=600, tpm=60_000, clock=clock)  # 0.1 s/request, 1 ms/token
    starts: list[tuple[float, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(60):
            tokens = rng.choice((1, 50, 100, 250))
            wait = pacer.reserve(tokens)
            with lock:
                starts.append((wait, tokens))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    starts.sort()
    assert len(starts) == 480
    for (start, tokens), (following, _) in itertools.pairwise(starts):
        # each start leaves room for one request (0.1 s) and for its tokens (1 ms each)
        assert following - start == pytest.approx(max(0.1, tokens / 1000), abs=1e-9)
    assert max_in_window([s for s, _ in starts], 1.0) <= 11


def test_threads_sleeping_for_real_keep_the_pace() -> None:
    """Eight threads on the real clock: the slots they are given are 10 ms apart, and they
    really wait for them. Bunching is checked on the slots (what the pacer decides), not on
    the wake-up times: on a loaded machine the scheduler wakes sleepers late, together (CI:
    13 in a 100 ms window)."""
    last_reading = threading.local()

    def clock() -> float:
        last_reading.now = time.monotonic()
        return last_reading.now

    pacer = RequestPacer(rpm=6000, clock=clock)  # one request every 10 ms
    slots: list[float] = []
    sent: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(6):
            delay = pacer.reserve(1)
            slot = last_reading.now + delay
            time.sleep(delay)
            with lock:
                slots.append(slot)
                sent.append(time.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(sent) - min(sent) >= 47 * 0.01 * 0.95  # 48 requests, 47 gaps of 10 ms
    assert all(s >= slot for s, slot in zip(sorted(sent), sorted(slots), strict=True))
    gaps = [b - a for a, b in zip(sorted(slots), sorted(slots)[1:], strict=False)]
    assert min(gaps) >= 0.01 * 0.999, min(gaps)


def test_carry_over_keeps_the_old_pacers_bookings() -> None:
    """A budget whose limits change (a run with another --rpm on the same account) starts
    no earlier than the old pacer's next request would have: no burst on the change."""
    clock = FakeClock()
    old = RequestPacer(rpm=60, clock=clock)
    for _ in range(3):
        old.reserve(1)  # booked until now + 3 s
    new = RequestPacer(rpm=120, tpm=600, clock=clock)
    new.carry_over(old)
    assert new.reserve(10) == pytest.approx(3.0)
    assert new.reserve(10) == pytest.approx(4.0)  # 10 tokens at 600 TPM: 1 s after
