"""``--max-cost``: what one embedding client has spent, checked before every request it sends.

A request is *booked* when it is about to go out (its estimated tokens, ``estimate_tokens``
summed, held while it is in flight) and *settled* by its answer (the tokens the server
reported in ``usage``; the estimate if a 2xx answer reports none; nothing for a failed
answer, which is not billed). A request is refused when what was spent, plus what is in
flight, plus its own estimate would pass the cap. So concurrent requests of the process
never pass the cap together: the cap is passed only as far as one request's reported tokens
exceed its estimate (the estimate over-counts English by a third, so in practice never).

One ``SpendCap`` per client, and one client per process (``factory.build_embedder``): the
cap holds for the process's chunk tasks, which is why ``--max-cost`` is refused with Dask
workers and the Batch API (``embedline.settings``). It counts from zero at each command: a
rerun resumes the run and may spend up to its own cap.
"""

from __future__ import annotations

import threading

from embedline.errors import CostCapError
from embedline.summary import usd

__all__ = ["SpendCap"]


class SpendCap:
    """The spend of one client against ``max_cost`` USD at ``price_per_million`` USD per 1M
    tokens. Thread-safe."""

    def __init__(self, *, max_cost: float, price_per_million: float) -> None:
        self.max_cost, self.price_per_million = max_cost, price_per_million
        self._lock = threading.Lock()
        self.tokens = 0  # reported by the server (or estimated, when a 2xx reported none)
        self._in_flight = 0  # estimated tokens of the requests booked and not yet settled

    def usd(self, tokens: int) -> float:
        """The price of ``tokens`` in USD."""
        return tokens * self.price_per_million / 1e6

    @property
    def spent(self) -> float:
        """USD spent so far (settled requests)."""
        return self.usd(self.tokens)

    def book(self, estimated_tokens: int) -> None:
        """Book a request of ``estimated_tokens`` about to be sent.

        :raises CostCapError: what was spent, what is in flight and this request would pass
            ``max_cost``; the message says what was spent, what remains and how to go on.
        """
        with self._lock:
            committed = self.tokens + self._in_flight
            if self.usd(committed + estimated_tokens) > self.max_cost:
                raise CostCapError(self._refusal(estimated_tokens))
            self._in_flight += estimated_tokens

    def settle(self, estimated_tokens: int, reported_tokens: int | None) -> None:
        """The booked request's answer: ``reported_tokens`` billed (None: a failed answer,
        not billed; 0 from a 2xx that reported no usage: the estimate is counted)."""
        with self._lock:
            self._in_flight -= estimated_tokens
            if reported_tokens is not None:
                self.tokens += reported_tokens or estimated_tokens

    def _refusal(self, estimated_tokens: int) -> str:
        spent = self.spent
        return (
            f"--max-cost {usd(self.max_cost)} reached: {usd(spent)} spent "
            f"({self.tokens:,} tokens reported), {usd(max(0.0, self.max_cost - spent))} "
            f"left, the next request's estimated {estimated_tokens:,} tokens "
            f"({usd(self.usd(estimated_tokens))}) would pass it; published chunks are kept: "
            "rerun with a higher --max-cost to resume (embedline run --dry-run shows what "
            "is left)"
        )
