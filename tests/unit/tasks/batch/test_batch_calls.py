"""``tasks.batch.calls``: which of the provider's listed batches a run adopts without a
record of them (a fresh or lost ledger), and the exact match of a part still ``creating``."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

from adapters.ledger import Ledger
from tasks.batch.calls import BatchCalls, usable

RUN, CHUNK = "r" * 64, "c" * 64
SPEC: Any = SimpleNamespace(index=3, key=CHUNK)


def batch(
    batch_id: str,
    part: int,
    *,
    status: str = "in_progress",
    completed: int = 0,
    run: str = RUN,
    chunk: str = CHUNK,
    index: int = 3,
    age_s: float = 60.0,
    file_id: str | None = "file_x",
) -> dict[str, Any]:
    return {
        "id": batch_id,
        "status": status,
        "input_file_id": file_id,
        "created_at": int(time.time() - age_s),
        "request_counts": {"total": 2, "completed": completed, "failed": 0},
        "metadata": {
            "embedline_run": run,
            "embedline_chunk": chunk,
            "embedline_index": str(index),
            "embedline_part": str(part),
        },
    }


class Listing:
    """A Batch API client that only lists (newest first), counting the lists."""

    def __init__(self, batches: list[dict[str, Any]]) -> None:
        self.batches, self.lists = batches, 0

    def list_batches(self) -> Any:
        self.lists += 1
        return iter(self.batches)


def test_a_batch_that_ran_nothing_is_not_usable() -> None:
    assert usable(batch("b", 0, status="validating"))
    assert usable(batch("b", 0, status="completed"))
    assert not usable(batch("b", 0, status="failed"))
    assert not usable(batch("b", 0, status="expired"))
    assert usable(batch("b", 0, status="expired", completed=1))
    assert not usable(batch("b", 0, status="cancelled"))


def test_unrecorded_batches_are_this_runs_chunks_newest_per_part_within_the_window() -> None:
    ledger = Ledger(":memory:")
    ledger.add_batch_parts(RUN, 3, CHUNK, [(5, 0, 1, (("a" * 64, (0,)),))])
    ledger.mark_batch_submitted(RUN, 3, 5, batch_id="known", input_file_id="f", status="x")
    client = Listing(
        [
            batch("newer0", 0),
            batch("older0", 0),
            batch("known", 5),  # the ledger records it
            batch("failed1", 1, status="failed"),
            batch("otherrun", 2, run="o" * 64),
            batch("otherchunk", 2, chunk="d" * 64),
            batch("otherindex", 2, index=4),
            batch("noinput", 2, file_id=None),
            batch("part2", 2),
            batch("tooold", 4, age_s=26 * 3600),  # the list is read no further back
            batch("older", 6, age_s=27 * 3600),
        ]
    )
    calls = BatchCalls(client, ledger, RUN, logging.getLogger("test"))  # type: ignore[arg-type]
    found = calls.unrecorded(SPEC)
    assert {part: b["id"] for part, b in found.items()} == {0: "newer0", 2: "part2"}
    calls.unrecorded(SPEC)
    assert client.lists == 1  # read once per stage


def test_a_part_still_creating_adopts_only_the_batch_made_from_its_upload() -> None:
    client = Listing([batch("b1", 0, file_id="file_other")])
    calls = BatchCalls(client, Ledger(":memory:"), RUN, logging.getLogger("test"))  # type: ignore[arg-type]
    assert calls.find(SPEC, 0, "file_mine") is None  # same part number, other requests
    assert calls.find(SPEC, 0, "file_other")["id"] == "b1"  # type: ignore[index]
