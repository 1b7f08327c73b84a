"""The ``token_calibration`` table: per endpoint and model, the tokens servers reported and
the estimate of the same texts, summed over runs (``embedline.calibration``)."""

from __future__ import annotations

from adapters.ledger.base import LedgerBase, now_iso
from embedline.calibration import Calibration

__all__ = ["CalibrationTable"]


def endpoint_id(base_url: str) -> str:
    """The endpoint's key in the table: ``base_url`` without a trailing slash."""
    return base_url.rstrip("/")


class CalibrationTable(LedgerBase):
    """Cumulative (reported, estimated) token sums per (endpoint, model)."""

    def add_calibration(self, base_url: str, model: str, *, reported: int, estimated: int) -> None:
        """Add a run's ``reported`` tokens (answers' ``usage``) and the ``estimated`` tokens
        of the same texts to ``base_url``'s sums for ``model``; nothing when either is 0."""
        if reported <= 0 or estimated <= 0:
            return
        with self.atomic() as db:
            db.execute(
                """INSERT INTO token_calibration
                       (base_url, model, tokens_reported, tokens_estimated, updated_at)
                   VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT (base_url, model) DO UPDATE SET
                       tokens_reported = tokens_reported + excluded.tokens_reported,
                       tokens_estimated = tokens_estimated + excluded.tokens_estimated,
                       updated_at = excluded.updated_at""",
                (endpoint_id(base_url), model, reported, estimated, now_iso()),
            )

    def calibration(self, base_url: str, model: str) -> Calibration | None:
        """The sums recorded for ``model`` at ``base_url``, or None if no run recorded any."""
        row = self._conn.execute(
            """SELECT tokens_reported, tokens_estimated FROM token_calibration
               WHERE base_url = ? AND model = ?""",
            (endpoint_id(base_url), model),
        ).fetchone()
        if row is None:
            return None
        return Calibration(endpoint_id(base_url), model, int(row[0]), int(row[1]))
