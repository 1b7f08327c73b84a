"""How a ``Run`` (``flows/run.py``) ends short of its commit, as exceptions its driver
(``flows/driver.py``) handles: stopped with a summary, refused before it started, or a delta
night to run again as a full night."""

from __future__ import annotations

from embedline.summary import RunSummary

__all__ = ["NightOfAnotherLength", "RunRefused", "RunStopped"]


class RunStopped(Exception):
    """Raised by a ``Run`` step that ends the run short of its commit; ``summary`` says why
    (built by ``Run``, and recorded in the ledger if the run was)."""

    def __init__(self, summary: RunSummary) -> None:
        super().__init__(summary.message)
        self.summary = summary


class NightOfAnotherLength(Exception):
    """Raised by ``Run.conclude`` of a delta night whose new vectors have another length
    than those it inherits (``--dimensions`` unset and the server's default changed): the
    driver opens the run again as a full night (``Run.open(full_night=True)``), which
    embeds the inherited rows again at the new length; what the delta published stays.
    ``length``: the night's (the server's, learned this command), ``inherited``: the base's."""

    def __init__(self, length: int, inherited: int) -> None:
        super().__init__(f"{length} against {inherited}")
        self.length, self.inherited = length, inherited


class RunRefused(RunStopped):
    """Raised by ``Run.open`` when the run cannot start (invalid input, an unreadable store):
    nothing is recorded and ``summary`` has no run key."""
