"""What the command says at its end when a run stops or commits, recorded while the run goes
on: the run it committed (so an interrupt after the commit is not reported as work to redo),
what it leaves running elsewhere (Batch API batches), and the loss of the Prefect API with
the summary the flow hands over to the CLI thread that waits for it.

One per process, ``STOP.report`` (``embedline.shutdown``): the flow writes it, the CLI reads
it for its last lines, and a task reads the API loss (``flows.artifacts``'s progress artifact
stops posting), which is why it lives in the core. No signal handling and no exit here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["ApiLoss", "Committed", "StopReport"]


@dataclass(frozen=True, slots=True)
class ApiLoss:
    """Why the run stops: ``what`` happened, and ``todo`` for the user (one line each part)."""

    what: str
    todo: str


@dataclass(frozen=True, slots=True)
class Committed:
    """The run this command committed: its run key, manifest URI, ``todo`` (what a rerun would
    still do, e.g. load a sink) and, once nothing is left but reporting, its ``summary``
    (``RunSummary.to_dict()``)."""

    run_key: str
    manifest_uri: str
    todo: str
    summary: dict[str, Any] | None


class StopReport:
    """What a run has recorded for the command's last lines (module docstring). ``owner``:
    the object whose ``report`` attribute this is; a pickled report is the receiving
    process's own, as its owner is (its events cannot be copied)."""

    def __init__(self, owner: object) -> None:
        self._owner = owner
        self._committed: Committed | None = None
        #: What an interrupt left running elsewhere (Batch API batches), for its last line.
        self._left_running: str | None = None
        self._api_loss: ApiLoss | None = None
        self._dispatched = threading.Event()  # a flow of this process started dispatching
        self._handed_over = threading.Event()
        self._summary: dict[str, Any] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (self._owner, "report"))

    def begin_command(self) -> None:
        """A new command in this process: forget the last command's committed run."""
        self._committed = None

    def dispatching_started(self) -> None:
        """A flow of this process started dispatching chunks: from now on it ends by
        ``hand_over`` if the API goes away (before, a CLI that lost the API has nothing to
        wait for and exits at once)."""
        self._dispatched.set()

    # -- work left running elsewhere ------------------------------------------------------

    def note_left_running(self, what: str | None) -> None:
        """Record what an interrupt leaves running outside this process (e.g. "3 batches
        keep running at the provider: ..."), for the command's last line; None clears it."""
        self._left_running = what

    def left_running(self) -> str | None:
        """What ``note_left_running`` recorded, if anything."""
        return self._left_running

    # -- the committed run ----------------------------------------------------------------

    def note_committed(
        self, run_key: str, manifest_uri: str, todo: str, summary: dict[str, Any] | None = None
    ) -> None:
        """Record that this command committed run ``run_key`` (its manifest and the ledger's
        record of it are written; ``todo``: what a rerun would still do, e.g. load a sink),
        so an interrupt from now on is not reported as work to redo. ``summary``: the run's
        summary, given once nothing is left to do but report it."""
        self._committed = Committed(run_key, manifest_uri, todo, summary)

    def committed(self) -> Committed | None:
        """The run this command committed, if any (until the next command)."""
        return self._committed

    # -- the Prefect API lost -------------------------------------------------------------

    def note_api_lost(self, loss: ApiLoss) -> None:
        """Record that the Prefect API went away: the run stops dispatching (never
        cleared)."""
        self._api_loss = loss

    def api_lost(self) -> ApiLoss | None:
        """The loss of the Prefect API that is stopping the run, if any."""
        return self._api_loss

    def hand_over(self, summary: dict[str, Any]) -> bool:
        """Give the run's summary to the CLI thread waiting after an API loss; True if one is
        waiting for it (the flow's return value will then not be read)."""
        if self._api_loss is None:
            return False
        self._summary = summary
        self._handed_over.set()
        return True

    def wait_for_hand_over(self, timeout_s: float) -> dict[str, Any] | None:
        """The summary the flow hands over, waiting at most ``timeout_s`` seconds once it
        started dispatching; None if it did not, or did not hand over in time."""
        if not self._dispatched.is_set() and not self._handed_over.is_set():
            return None
        self._handed_over.wait(timeout_s)
        return self._summary
