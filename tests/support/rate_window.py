"""An enforced RPM/TPM limit for the fake embeddings server: ``fake.fail_when(RateWindow(...))``.

A provider's per-minute limit "may be quantized", i.e. enforced over shorter periods (OpenAI
rate-limits guide, https://platform.openai.com/docs/guides/rate-limits): this one is a token
bucket per limit, refilled at ``limit / 60`` per second and holding ``burst_s`` seconds of
it (the provider's tolerance). A request the bucket cannot take gets a 429 with
``Retry-After`` (whole seconds, at least 1) and is counted in ``refused``; it takes nothing
from either bucket. Tokens are counted as the fake's ``usage`` counts them (words per text,
at least 1). ``accepted_at`` and ``accepted_tokens`` keep the arrival time
(``time.monotonic()``) and tokens of every request let through, for the rate a test
achieved.
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

__all__ = ["RateWindow"]


class _Bucket:
    """``per_minute`` units a minute, ``burst_s`` seconds of them held at most."""

    def __init__(self, per_minute: int, burst_s: float, now: float) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.level = self.capacity
        self.at = now

    def wait_for(self, weight: float, now: float) -> float:
        """Seconds until ``weight`` units fit (0.0: they fit now)."""
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now
        missing = min(weight, self.capacity) - self.level
        return max(0.0, missing / self.rate)


class RateWindow:
    """A ``fail_when`` predicate enforcing ``rpm`` and/or ``tpm`` on the fake server.

    :param rpm: requests per minute, or None.
    :param tpm: tokens per minute, or None.
    :param burst_s: seconds of each limit a bucket holds (1.0: one second's worth).
    """

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None, burst_s: float = 1.0):
        now = time.monotonic()
        self._lock = threading.Lock()
        self._requests = _Bucket(rpm, burst_s, now) if rpm else None
        self._tokens = _Bucket(tpm, burst_s, now) if tpm else None
        self.refused = 0
        self.accepted_at: list[float] = []
        self.accepted_tokens: list[int] = []

    def __call__(self, payload: Any) -> dict[str, Any] | None:
        texts = payload.get("input") if isinstance(payload, dict) else None
        texts = texts if isinstance(texts, list) else [texts]
        tokens = sum(max(1, len(t.split())) for t in texts if isinstance(t, str))
        with self._lock:
            now = time.monotonic()
            waits = [
                bucket.wait_for(weight, now)
                for bucket, weight in ((self._requests, 1), (self._tokens, tokens))
                if bucket is not None
            ]
            wait = max(waits, default=0.0)
            if wait > 0:
                self.refused += 1
                return {
                    "status": 429,
                    "headers": {"Retry-After": str(max(1, math.ceil(wait)))},
                    "body": json.dumps(
                        {
                            "error": {
                                "message": "Rate limit reached",
                                "type": "requests",
                                "param": None,
                                "code": "rate_limit_exceeded",
                            }
                        }
                    ),
                }
            if self._requests is not None:
                self._requests.level -= 1
            if self._tokens is not None:
                self._tokens.level -= tokens
            self.accepted_at.append(now)
            self.accepted_tokens.append(tokens)
        return None

    def rate_per_minute(self, *, skip_s: float = 0.0, tokens: bool = False) -> float:
        """Requests (``tokens``: tokens) accepted per minute from ``skip_s`` seconds after the
        first accepted request to the last one (the steady part of a run); the last
        request's weight is left out, as it started at the period's end."""
        with self._lock:
            accepted = list(zip(self.accepted_at, self.accepted_tokens, strict=True))
        start = accepted[0][0] + skip_s if accepted else 0.0
        steady = [(at, n if tokens else 1) for at, n in accepted if at >= start]
        if len(steady) < 2:
            return 0.0
        return 60.0 * sum(n for _, n in steady[:-1]) / (steady[-1][0] - start)
