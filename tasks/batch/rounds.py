"""When the Batch API stage submits a chunk's unanswered requests again, and how long it
waits for the enqueued-token budget: the rules that make the stage always end.

- Requests a batch left unanswered because it expired or was cancelled before running them
  (or whose batch was refused for the token limit) are submitted again while the run's
  completion window lasts (``COMPLETION_WINDOW_S`` from the stage's start in this process),
  and at least once per run: a rerun always submits them again, never does nothing.
- Requests the server ran and failed (5xx, 429 in the error file) are submitted again at
  most ``MAX_ERROR_ROUNDS`` times per chunk in one run.
- Past either, the chunk goes to its task with what its batches answered; with
  ``--batch-fallback sync`` the task sends the rest synchronously, else it fails with one
  line naming the command that finishes it (``unanswered_message``).

``TokenBackoff`` spaces the creates refused for the model's enqueued-token limit: waits
doubling from the poll interval (at most an hour), back to the first after progress (a
batch of the run created or ended), within the completion window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from embedline.errors import FatalError

__all__ = [
    "COMPLETION_WINDOW_S",
    "MAX_ERROR_ROUNDS",
    "Rounds",
    "TokenBackoff",
    "unanswered_message",
    "unfittable_message",
]

#: Seconds a run submits unanswered requests again for: the Batch API's completion window.
COMPLETION_WINDOW_S = 24 * 3600.0
#: Resubmissions per chunk and run of requests the server ran and failed (5xx, 429).
MAX_ERROR_ROUNDS = 4
_MAX_TOKEN_WAIT_S = 3600.0


@dataclass(slots=True)
class Rounds:
    """A run's resubmissions of chunks' unanswered requests (module docstring).

    ``clock``: seconds (monotonic); the window starts at construction and is read from
    ``COMPLETION_WINDOW_S`` then (tests shorten it)."""

    clock: Callable[[], float]
    started: float = 0.0
    window_s: float = 0.0
    errors: dict[int, int] = field(default_factory=dict)  # chunk → error rounds so far
    rounds: set[int] = field(default_factory=set)  # chunks submitted again in this run

    def __post_init__(self) -> None:
        self.started, self.window_s = self.clock(), COMPLETION_WINDOW_S

    def window_left(self) -> bool:
        """Whether the run's completion window still lasts."""
        return self.clock() - self.started < self.window_s

    def again(self, chunk: int, *, pending: int, errored: int) -> bool:
        """Whether chunk ``chunk``'s ``pending`` unanswered requests, ``errored`` of them
        run and failed by the server, are submitted again now (counted when they are)."""
        if not pending:
            return False
        if chunk in self.rounds and not self.window_left():
            return False
        if errored == pending:  # all of them server errors: a bounded number of rounds
            if self.errors.get(chunk, 0) >= MAX_ERROR_ROUNDS:
                return False
            self.errors[chunk] = self.errors.get(chunk, 0) + 1
        self.rounds.add(chunk)
        return True


@dataclass(slots=True)
class TokenBackoff:
    """Waits between creates refused for the enqueued-token limit (module docstring).

    ``poll_s``: the first wait (``--batch-poll-interval``); ``clock``: seconds."""

    poll_s: float
    clock: Callable[[], float]
    started: float = 0.0
    not_before: float = 0.0  # no create before this clock time
    waits: int = 0

    def __post_init__(self) -> None:
        self.started = self.clock()

    def refused(self, *, in_flight: bool) -> float:
        """A create was refused: the next create waits (returned, seconds) for batches of
        the run in flight to end (``in_flight``); with none, at once (the refused part is
        split to fit, or the refusal is an error: ``unfittable_message``).

        :raises FatalError: the wait would pass the completion window.
        """
        if not in_flight:
            self.not_before = self.clock()
            return 0.0
        self.waits += 1
        wait = min(self.poll_s * 2.0 ** (self.waits - 1), _MAX_TOKEN_WAIT_S)
        if self.clock() - self.started + wait > COMPLETION_WINDOW_S:
            raise FatalError(
                "the Batch API's enqueued-token limit stayed full for the whole completion "
                "window: give --batch-enqueued-tokens below the model's limit, raise the "
                "limit, or rerun with --batch-fallback sync to send the rest synchronously"
            )
        self.not_before = self.clock() + wait
        return wait

    def progress(self) -> None:
        """A batch of the run was created or ended: the next refusal waits the least."""
        self.waits = 0

    def delay(self) -> float:
        """Seconds to wait before the next create (0: none)."""
        return max(0.0, self.not_before - self.clock())


def unanswered_message(texts: int) -> str:
    """What a chunk task says of ``texts`` texts its batches left unanswered when the run
    gave up submitting them (the completion window, or repeated server errors)."""
    return (
        f"{texts} texts have no answer in the chunk's batches: rerun with "
        "--batch-fallback sync to send them synchronously (full price), or rerun as it "
        "is to submit them in batches again"
    )


def unfittable_message(batch_id: str, chunk: int, error: str) -> str:
    """Why the run stops when a batch of one input is refused for the enqueued-token limit
    with no batch of the run in flight: no wait can end it, nothing smaller can be sent."""
    return (
        f"batch {batch_id} (chunk {chunk}) holds one input and the Batch API's enqueued-token "
        "limit refuses it with no batch of this run in flight "
        f"({error or 'token_limit_exceeded'}): "
        "no wait can end this; rerun with --batch-fallback sync to send it synchronously "
        "(full price), or raise the model's enqueued-token limit"
    )
