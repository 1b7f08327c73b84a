"""A delta night's dead letters that no chunk holds: its empty texts (``tasks/plan/delta.py``
writes them to ``EMPTIES_FILE`` beside its change set), recorded in the ledger when the night
commits, so ``embedline dead-letters`` lists a delta night's as a full night's."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from adapters.ledger import Ledger
from embedline.models import DeadLetter, InputPlan
from tasks.plan.delta import EMPTIES_FILE

__all__ = ["record_unwritten_empties"]


def record_unwritten_empties(ledger: Ledger, plan: InputPlan, run_key: str) -> int:
    """Record the empty texts of the delta night ``plan`` (none for a full night) as run
    ``run_key``'s ``empty_text`` dead letters (``Ledger.record_unwritten``); returns how many."""
    if plan.delta is None or plan.scratch is None:
        return 0
    path = Path(plan.scratch) / EMPTIES_FILE
    if not path.exists():
        return 0
    table = pq.read_table(path)
    rows, ids = table.column("row").to_pylist(), table.column("id").to_pylist()
    ledger.record_unwritten(
        run_key, [DeadLetter(r, i, "empty_text") for r, i in zip(rows, ids, strict=True)]
    )
    return len(rows)
