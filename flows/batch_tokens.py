"""The model's enqueued-token limit as the Batch API stage (``flows.batch_stage``) meets it.

A batch ``failed`` for ``token_limit_exceeded`` (or a create refused so) teaches a token cap
(``tasks.batch.records.token_cap``: the limit the provider's message states, else half the
refused batch): every part larger than the budget (the cap, or ``--batch-enqueued-tokens``
when lower) is split to fit (``tasks.batch.requests.fit``, then ``pack``), and the refused
requests are submitted again, after the run's batches in flight end
(``tasks.batch.rounds.TokenBackoff``: exponential backoff, reset after progress, within the
24 h window), at once when none is. A refused batch of one input with none of the run's in
flight can never fit: no wait can end, nothing smaller can be sent, so the run stops (exit
3) saying what to change (``tasks.batch.rounds.unfittable_message``), unless
``--batch-fallback sync`` sends it synchronously.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from adapters.ledger import BatchRecord, Ledger
from embedline.settings import RunSettings
from tasks.batch.calls import Log
from tasks.batch.records import one_input, running_batches, token_cap, unconfirmed
from tasks.batch.requests import BatchRequest
from tasks.batch.rounds import TokenBackoff, unfittable_message

__all__ = ["TokenLimit"]


class TokenLimit:
    """A run's enqueued-token budget and the waits it imposes (module docstring).

    ``sent``: the stage's (chunk, part) whose create was sent (a batch may be in flight);
    ``clock``: seconds."""

    def __init__(
        self,
        *,
        settings: RunSettings,
        ledger: Ledger,
        run_key: str,
        log: Log,
        sent: Collection[tuple[int, int]],
        clock: Callable[[], float],
    ) -> None:
        self.settings, self.ledger, self.run_key, self.log = settings, ledger, run_key, log
        self._sent = sent
        self.backoff = TokenBackoff(settings.batch_poll_interval_s, clock)
        self.cap: int | None = None  # estimated tokens a batch may pack, learned
        self.created: dict[str, int] = {}  # estimated tokens of each batch created, by id
        self._seen: set[str] = set()  # refused batches already counted

    def budget(self) -> int | None:
        """The estimated tokens a batch may pack: ``--batch-enqueued-tokens`` and the cap
        learned from ``token_limit_exceeded``, the lower; None: no limit known."""
        budgets = [b for b in (self.settings.batch_enqueued_tokens, self.cap) if b]
        return min(budgets) if budgets else None

    def created_batch(self, batch_id: str, tokens: int, *, failed: bool) -> None:
        """A create answered batch ``batch_id`` of ``tokens`` estimated tokens; one not
        ``failed`` at once is progress (the budget let it in)."""
        self.created[batch_id] = tokens
        if not failed:
            self.backoff.progress()

    def refused_at_create(
        self, error: str, tokens: int, requests: Sequence[BatchRequest], chunk: int
    ) -> str | None:
        """A create of ``requests`` (``tokens`` estimated) was refused with ``error``: learn
        the cap and wait; return why the run stops when the refusal can never end."""
        self.cap = token_cap(error, tokens, self.cap)
        single = len(requests) == 1 and len(requests[0].texts) == 1
        why = unfittable_message("(refused at create)", chunk, error)
        return self._limited(lambda: why if single else None, tokens)

    def refused_batch(self, record: BatchRecord, chunk: int) -> str | None:
        """Batch ``record`` failed for the token limit: learn the cap once per batch and,
        when this run created it, wait; return why the run stops when it can never end."""
        if record.batch_id in self._seen:
            return None
        self._seen.add(str(record.batch_id))
        tokens = self.created.get(str(record.batch_id))
        self.cap = token_cap(record.error or "", tokens, self.cap)
        if tokens is None:  # an earlier run's refusal: nothing to wait for
            return None
        return self._limited(
            lambda: (
                unfittable_message(str(record.batch_id), chunk, record.error or "")
                if one_input(self.ledger.run_batches(self.run_key), str(record.batch_id))
                else None
            ),
            tokens,
        )

    def _limited(self, unfittable: Callable[[], str | None], tokens: int) -> str | None:
        """Wait for the run's batches in flight (``TokenBackoff``); with none in flight, a
        refused batch of one input (``unfittable()`` says why) stops the run unless
        ``--batch-fallback sync`` sends it synchronously; a larger one (``tokens``
        estimated) is split at once, the cap at most half of it (what is free of the
        budget is less than it, whatever the message states: other batches may hold it)."""
        in_flight = self.in_flight()
        if not in_flight:
            self.cap = max(1, min(self.cap or tokens, tokens // 2))
            why = unfittable() if self.settings.batch_fallback != "sync" else None
            if why is not None:
                return why
        wait = self.backoff.refused(in_flight=in_flight)
        self.log.warning(
            "token_limit_exceeded: the model's enqueued-token budget is full; %s",
            f"submitting again in {wait:.1f} s, after earlier batches finish"
            if in_flight
            else "no batch of this run is in flight: splitting the refused part to fit",
        )
        return None

    def in_flight(self) -> bool:
        """Whether a batch of the run may still hold part of the enqueued-token budget."""
        records = self.ledger.run_batches(self.run_key)
        return bool(running_batches(records) or unconfirmed(records, self._sent))
