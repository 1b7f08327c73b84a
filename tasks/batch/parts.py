"""The requests of a chunk's Batch API parts: what the chunk needs answered now (its reuse
plan, batched by the run's settings), what each part recorded in the ledger carries (its
layout, never derived again from settings that may have changed), and what no batch of the
chunk answered yet."""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from adapters.csv_chunks import read_chunk
from adapters.ledger import BatchRecord
from embedline.models import ChunkSpec, ReusePlan, Row
from embedline.settings import RunSettings
from tasks.batch.calls import BatchCalls
from tasks.batch.outputs import OUTPUTS
from tasks.batch.requests import (
    BatchRequest,
    BatchResults,
    Resolved,
    chunk_requests,
    layout_requests,
)

__all__ = ["PartRequests"]


class PartRequests:
    """A run's chunk requests for the Batch API stage. ``source``: the input the chunks are
    read from; ``plans``: each chunk's reuse plan by index (filled in by the stage as it
    starts a chunk); ``calls``: reads the result files of a part's batches."""

    def __init__(
        self, settings: RunSettings, source: Any, plans: dict[int, ReusePlan], calls: BatchCalls
    ) -> None:
        self.settings, self.source, self.plans, self.calls = settings, source, plans, calls

    def rows(self, spec: ChunkSpec) -> list[Row]:
        """The chunk's rows, read from the input."""
        return read_chunk(self.source, spec)

    def needed(
        self, spec: ChunkSpec, rows: list[Row], *, only: Collection[int] | None = None
    ) -> list[BatchRequest]:
        """What the chunk's task needs answered, batched by the run's settings now
        (``only``: just the rows at these positions)."""
        return chunk_requests(rows, self.plans[spec.index], self.settings, only=only)

    def carried(self, spec: ChunkSpec, record: BatchRecord, rows: list[Row]) -> list[BatchRequest]:
        """The requests part ``record`` carries: its recorded layout; for a part recorded
        without one (a ledger that kept no layouts), as the run's settings batch the chunk."""
        if record.layout is not None:
            return layout_requests(rows, record.layout, self.settings)
        needed = self.needed(spec, rows)
        return needed if record.req_start is None else needed[record.req_start : record.req_stop]

    def recorded(
        self, spec: ChunkSpec, rows: list[Row], records: list[BatchRecord]
    ) -> list[BatchRequest]:
        """Every request the chunk's parts ``records`` carry, each once, in order."""
        seen: set[str] = set()
        requests = []
        for record in records:
            for request in self.carried(spec, record, rows):
                if request.custom_id not in seen:
                    seen.add(request.custom_id)
                    requests.append(request)
        return requests

    def pending(self, spec: ChunkSpec, records: list[BatchRecord]) -> list[BatchRequest]:
        """The requests of ``records`` (as recorded) that no batch answered or rejected for
        good, and that carry a row the chunk still needs, each once."""
        return self.unanswered(spec, records).pending

    def unanswered(self, spec: ChunkSpec, records: list[BatchRecord]) -> Resolved:
        """``pending``, as a ``Resolved`` whose ``errored`` names those of them the server
        ran and failed (the others expired or were cancelled before they ran)."""
        results = BatchResults()
        for record in records:
            for file_id in (record.output_file_id, record.error_file_id):
                if file_id:
                    content = OUTPUTS.lines(
                        functools.partial(self.calls.file, record),
                        getattr(self.calls.client, "base_url", ""),
                        file_id,
                        spec.index,
                    )
                    results.add_output(
                        content, dimensions=self.settings.dimensions, chunk=spec.index
                    )
        rows = self.rows(spec)
        needed = {p for r in self.needed(spec, rows) for p in r.rows}
        resolved = results.resolve(self.recorded(spec, rows, records))
        resolved.pending = [r for r in resolved.pending if needed.intersection(r.rows)]
        resolved.errored &= {r.custom_id for r in resolved.pending}
        return resolved
