"""A run's counts from its chunks' outcomes (``flows.run_outcome``), as on Dask, where the flow
process has no cost of its own to read (the workers count in their processes)."""

from __future__ import annotations

from types import SimpleNamespace

from embedline.models import ChunkOutcome
from flows.dispatch import DispatchResult
from flows.run_outcome import outcome_fields


def test_texts_batches_answered_count_as_inputs_sent_and_as_batch_inputs() -> None:
    plan = SimpleNamespace(chunks=(0, 1), rows=8)
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


def test_inputs_are_what_was_charged_and_saved_is_measured_from_the_run() -> None:
    """The process's tally splits the texts: charged (answered) as ``inputs``, those of
    rate-limited requests as retried; the tokens reuse avoided are the rows not sent at
    their own lengths, scaled by what this run's answers reported per estimated token."""
    from embedline.progress import Usage

    plan = SimpleNamespace(chunks=(0, 1), rows=8)
    published = {
        i: ChunkOutcome(
            i,
            f"k{i}",
            f"o{i}",
            "s",
            rows=4,
            tokens=20,
            inputs=2,
            reused=2,
            tokens_saved=99,
            tokens_bound=40,
        )
        for i in (0, 1)
    }
    usage = Usage(requests=5, tokens=40, inputs=4, requests_retried=3, inputs_retried=6)
    fields = outcome_fields(plan, "r" * 64, {}, DispatchResult(published=published), cost=usage)  # type: ignore[arg-type]
    assert (fields["inputs"], fields["requests"], fields["tokens"]) == (4, 5, 40)
    assert (fields["requests_retried"], fields["inputs_retried"]) == (3, 6)
    # 198 estimated tokens reused, at the 40 reported for 80 estimated of the texts sent
    assert (fields["rows_reused"], fields["tokens_saved"]) == (4, 99)
    assert fields["tokens_saved_measured"] is True
