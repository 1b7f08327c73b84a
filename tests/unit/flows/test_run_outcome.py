"""A run's counts from its chunks' outcomes (``flows.run_outcome``), as on Dask, where the flow
process has no cost of its own to read (the workers count in their processes)."""

from __future__ import annotations

from types import SimpleNamespace

from embedline.models import ChunkOutcome
from flows.dispatch import DispatchResult
from flows.run_outcome import outcome_fields


def test_texts_batches_answered_count_as_inputs_sent_and_as_batch_inputs() -> None:
    plan = SimpleNamespace(chunks=(0, 1))
    published = {
        i: ChunkOutcome(
            i, f"k{i}", f"o{i}", "s", rows=4, tokens=20, inputs=4, batch_tokens=20, batch_inputs=4
        )
        for i in (0, 1)
    }
    fields = outcome_fields(plan, "r" * 64, {}, DispatchResult(published=published))  # type: ignore[arg-type]
    assert (fields["inputs"], fields["batch_inputs"], fields["requests"]) == (8, 8, 0)
    assert (fields["tokens"], fields["batch_tokens"]) == (40, 40)
    assert fields["exit_code"] == 0
