"""Process-wide request pacing: requests per minute (RPM) and tokens per minute (TPM).

The same pacer holds a Dask cluster's budget, once, on its scheduler
(``tasks.embed.cluster_budget``); a client there is given that budget as its ``Pacer``.

``RequestPacer`` spaces requests evenly instead of letting a whole minute's allowance out at
once: with ``rpm=120`` a request may start every 0.5 s; with ``tpm=60_000`` a request of
1,000 tokens holds the next one back by 1 s. RPM and TPM are the two limits OpenAI applies
per model and organization (OpenAI rate-limits guide,
https://platform.openai.com/docs/guides/rate-limits: "RPM - requests per minute",
"TPM - tokens per minute"; limits "may be quantized", i.e. enforced over shorter periods,
which is why an even pace is safer than a per-minute burst).

Algorithm: GCRA (generic cell rate algorithm, ITU-T I.371) in its virtual-scheduling form,
one theoretical arrival time ``tat`` (``time.monotonic()`` seconds) per rate, with no burst
tolerance beyond one request. A request of weight ``w`` (1 for RPM, its tokens for TPM)
starts at ``start = max(now, tat_rpm, tat_tpm)`` and moves each ``tat`` to
``start + w * 60 / limit``. So:

- after an idle period the first request goes at once (a burst of exactly one request);
- at steady state requests start ``60 / rpm`` seconds apart, or ``tokens * 60 / tpm``
  seconds after the previous request's start, whichever is later;
- a request heavier than a whole minute's TPM never deadlocks: it goes as soon as every
  earlier reservation has elapsed (the bucket is "full"), and the requests after it wait for
  its whole weight (more than a minute). Nothing is clamped, so the long-run average never
  exceeds the limit;
- over any window of ``L`` seconds, at most ``1 + L * rpm / 60`` requests start, and the
  requests starting in it book at most ``L * tpm / 60`` tokens plus the last one's weight.

``reserve`` books the slot and returns how long to wait; the caller sleeps outside the lock
(and outside any concurrency slot). ``correct`` adjusts TPM once the server's ``usage`` is
known: an under-estimate is debited (``tat`` moves later at once) and an over-estimate
credited, applied to the reservations that follow. A credit often arrives after later
requests were booked (each request in flight holds a slot; on a Dask cluster a worker's
credits ride on its next reservation, so several land at once), and those slots are fixed.
So a credit moves ``tat`` back, but never before the latest booking's start plus its likely
weight: its estimate times the ``usage``/estimate ratio of the last minute's worth of
corrected tokens. What a credit cannot use yet waits for the bookings that follow, each
taking what its own likely weight leaves (at most one second's worth waits). Without that
floor, credits landing together would start several requests together, beyond the second's
worth a provider's per-minute limit tolerates. A credit never moves ``tat`` before ``now``
either: idle time does not accumulate into a burst, and the rest of such a credit is dropped.

Thread-safe: one ``threading.Lock`` guards every ``tat``; nothing sleeps under it. The clock
is injected (tests pass a fake one).

Why not a library: ``pyrate-limiter`` 4.5.1 was evaluated (its ``InMemoryBucket`` and
``Limiter`` are thread-safe: an ``RLock``, released while a blocked caller sleeps). It does not
fit here, measured on this machine: (1) it is a sliding-window log, so ``Rate(120,
Duration.MINUTE)`` admits all 120 requests at once; even pacing needs ``Rate(1, 500 ms)``,
and for tokens a short window refuses any request heavier than that window's share;
(2) a weight above a rate's limit is refused for good (``try_acquire`` returns False), the
deadlock this module must avoid; (3) there is no way to credit tokens back after ``usage``;
(4) each blocked wait adds ``buffer_ms`` (50 ms): ``Rate(1, 100 ms)`` paced 150 ms apart;
(5) a weight of 300,000 tokens is stored as 300,000 list entries, and every limiter starts a
background "Leaker" thread; (6) its sleep is ``time.sleep`` imported at module level, so
neither a fake clock nor an interruptible sleep (for the fatal latch) can be injected.
``limits`` (fixed/moving windows) has (1)-(3) too; ``aiolimiter`` is asyncio-only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["GCRA", "Pacer", "RequestPacer"]


class Pacer(Protocol):
    """What a client asks of its pacer: ``RequestPacer`` (one process), or a budget held
    elsewhere and shared by several processes (``tasks.embed.cluster_budget.ClusterPacer``)."""

    rpm: int | None
    tpm: int | None

    @property
    def enabled(self) -> bool: ...

    def reserve(self, tokens: int) -> float: ...

    def correct(self, *, estimated: int, used: int) -> None: ...


@dataclass(slots=True)
class GCRA:
    """One rate limit: ``per_minute`` units per minute, paced evenly. Not locked by itself.

    :param per_minute: the limit, units per minute (requests for RPM, tokens for TPM).
    :param tat: theoretical arrival time, ``clock()`` seconds: the earliest start of the next
        unit. 0.0 means idle since the clock's origin.
    """

    per_minute: int
    tat: float = 0.0

    def __post_init__(self) -> None:
        if self.per_minute < 1:
            raise ValueError(f"a rate limit must be at least 1 per minute, got {self.per_minute}")

    @property
    def interval_s(self) -> float:
        """Seconds one unit occupies: ``60 / per_minute``."""
        return 60.0 / self.per_minute

    def book(self, start: float, weight: float) -> None:
        """Record ``weight`` units starting at ``start`` (seconds; ``start >= tat``)."""
        self.tat = max(self.tat, start) + weight * self.interval_s

    def adjust(self, now: float, delta: float) -> None:
        """Add ``delta`` units (negative: credit back) to the booked time; never before ``now``."""
        self.tat = max(now, self.tat + delta * self.interval_s)


class RequestPacer:
    """Even pacing of one client's requests under an optional RPM and an optional TPM.

    :param rpm: requests per minute, or None for no request limit.
    :param tpm: tokens per minute, or None for no token limit.
    :param clock: seconds, monotonic (default ``time.monotonic``).
    :raises ValueError: if a limit is below 1.
    """

    def __init__(
        self,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._clock = clock
        self._lock = threading.Lock()
        self._requests = GCRA(rpm) if rpm is not None else None
        self._tokens = GCRA(tpm) if tpm is not None else None
        # TPM credits (see the module docstring): the latest booking, the credit not yet
        # applied, and the corrected tokens' estimate and over-estimate (the last minute's)
        self._last_start: float | None = None
        self._last_tokens = 0
        self._credit = 0.0
        self._corrected = 0.0
        self._returned = 0.0

    def __repr__(self) -> str:
        return f"RequestPacer(rpm={self.rpm!r}, tpm={self.tpm!r})"

    @property
    def enabled(self) -> bool:
        """True when at least one limit is set."""
        return self._requests is not None or self._tokens is not None

    def reserve(self, tokens: int) -> float:
        """Book one request of ``tokens`` (estimated) tokens; return seconds to wait before it.

        The request may be sent ``returned`` seconds from now (0.0: at once). The booking
        holds even if the caller gives up (a fatal error): that only makes pacing more
        conservative.
        """
        if not self.enabled:
            return 0.0
        with self._lock:
            now = self._clock()
            start = now
            for rate in (self._requests, self._tokens):
                if rate is not None:
                    start = max(start, rate.tat)
            if self._requests is not None:
                self._requests.book(start, 1)
            if self._tokens is not None:
                self._tokens.book(start, max(0, tokens))
                self._last_start, self._last_tokens = start, max(0, tokens)
                self._apply_credit(now)
        return start - now

    def carry_over(self, other: RequestPacer) -> None:
        """Take ``other``'s bookings (a budget whose limits changed): the next request starts
        no earlier than ``other``'s would have."""
        with self._lock, other._lock:
            latest = max(
                (r.tat for r in (other._requests, other._tokens) if r is not None), default=0.0
            )
            for rate in (self._requests, self._tokens):
                if rate is not None:
                    rate.tat = max(rate.tat, latest)
            self._last_start, self._last_tokens = other._last_start, other._last_tokens
            self._corrected, self._returned = other._corrected, other._returned

    def correct(self, *, estimated: int, used: int) -> None:
        """Replace ``estimated`` tokens by the ``used`` ones the server reported, for one
        request or for several answered since (their sums: a cluster worker's carried
        correction).

        ``used > estimated`` delays the following requests (debit); ``used < estimated``
        lets them go earlier (credit), but never earlier than now, nor closer to the latest
        booking than its likely weight (module docstring). No effect without a TPM.
        """
        if self._tokens is None:
            return
        with self._lock:
            now = self._clock()
            if estimated > 0:
                self._learn(estimated, used)
            debit = used - estimated
            if debit == 0:
                return
            if debit > 0:
                taken = min(self._credit, debit)  # credit not applied yet pays first
                self._credit -= taken
                self._tokens.adjust(now, debit - taken)
            else:
                self._credit += -debit
                self._apply_credit(now)

    def _learn(self, estimated: int, used: int) -> None:
        """Count corrected tokens toward the ratio, keeping about the last minute's worth."""
        self._corrected += estimated
        self._returned += estimated - used
        limit = self._tokens.per_minute if self._tokens is not None else 0
        if self._corrected > limit > 0:
            keep = limit / self._corrected
            self._corrected *= keep
            self._returned *= keep

    def _apply_credit(self, now: float) -> None:
        """Move the TPM ``tat`` back by the credit held, as far as it may go (under the
        lock): not before ``now`` (the rest is dropped), nor before the latest booking's
        start plus its likely weight (the rest, at most a second's worth, is kept for the
        next booking)."""
        rate = self._tokens
        if rate is None or self._credit <= 0:
            return
        floor = now
        if self._last_start is not None:
            share = self._returned / self._corrected if self._corrected else 0.0
            likely = self._last_tokens * (1 - min(1.0, max(0.0, share)))  # its likely tokens
            floor = max(floor, self._last_start + likely * rate.interval_s)
        tat = max(floor, rate.tat - self._credit * rate.interval_s)
        if tat < rate.tat:
            self._credit -= (rate.tat - tat) / rate.interval_s
            rate.tat = tat
        if floor <= now:
            self._credit = 0.0  # the rest would move ``tat`` into the past: idle time
        else:
            self._credit = min(max(0.0, self._credit), rate.per_minute / 60)
