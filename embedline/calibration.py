"""Token estimates calibrated by what a server reported (docs/guide/running.md, "Cost before
you pay").

Every run that gets answers with ``usage`` adds, per endpoint (``--base-url``) and model, the
tokens the server reported and the estimate (``adapters.embeddings.approximate_tokens``) of
the same texts to the ledger (``token_calibration``: two cumulative sums, never a text).
A dry run then scales its estimate by reported / estimated once at least
``MIN_CALIBRATION_TOKENS`` reported tokens back the ratio. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FIRST_RUN_METHOD", "MIN_CALIBRATION_TOKENS", "Calibration", "calibrated"]

#: Reported tokens an endpoint+model needs before its ratio is used (fewer: the first-run
#: estimate stands; a handful of short requests says little about a tokenizer).
MIN_CALIBRATION_TOKENS = 10_000

#: How a first-run estimate is made (said with every uncalibrated estimate).
FIRST_RUN_METHOD = (
    "estimated by script (Latin words, digits, punctuation, CJK characters), "
    "not yet calibrated by this endpoint's reported usage"
)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What one endpoint reported for one model, summed over runs: ``reported`` tokens (the
    answers' ``usage``) for texts whose estimate was ``estimated`` tokens."""

    base_url: str
    model: str
    reported: int
    estimated: int

    @property
    def ratio(self) -> float:
        """Reported tokens per estimated token (1.0 with nothing estimated)."""
        return self.reported / self.estimated if self.estimated > 0 else 1.0

    @property
    def usable(self) -> bool:
        """True once ``MIN_CALIBRATION_TOKENS`` reported tokens back the ratio."""
        return self.reported >= MIN_CALIBRATION_TOKENS and self.estimated > 0

    def apply(self, estimate: int) -> int:
        """``estimate`` scaled by the ratio, rounded (unchanged while not ``usable``)."""
        return round(estimate * self.ratio) if self.usable else estimate

    def method(self) -> str:
        """The dry run's ``tokens`` line for an estimate this calibration scaled."""
        return (
            f"calibrated by {self.reported:,} tokens reported by this endpoint for "
            f"{self.model} (× {self.ratio:.3f} the estimate by script)"
        )


def calibrated(estimate: int, calibration: Calibration | None) -> tuple[int, str]:
    """(tokens, method line) for a first-run ``estimate``: scaled by ``calibration`` when it
    is usable, else the estimate as it is with ``FIRST_RUN_METHOD``."""
    if calibration is None or not calibration.usable:
        return estimate, FIRST_RUN_METHOD
    return calibration.apply(estimate), calibration.method()
