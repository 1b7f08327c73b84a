"""The reuse stage (flow process, before dispatch): index → plan → copy, then a plan per chunk.

    refresh the reuse index (new chunk objects of the output) → join every row of the
    chunks to embed against it, against this run's kept requests and against each other
    (``tasks/reuse/row_sources.py``) → copy each needed vector once per source object into the
    chunk's file (``tasks/reuse/gather.py``) → for each chunk submitted, a small ``ReusePlan``:
    its copied-vectors file and the in-run owners it waits for.

Why a stage and not a lookup per chunk at submit time: a chunk's reused rows may come from
any earlier object (a shuffled export puts every chunk's rows in every object), so looking
up and reading per chunk reads each source object once per chunk that needs one of its rows
(chunks × objects reads; a shuffled 500,000-row night cost 2.4× the first run's CPU). Here
each source is read once per run and the lookups are one sorted join, with memory bounded
by a bucket, a source object and a write buffer.

Prefect-free, like ``flows.run.Run``: the flow drives it. Files live in the plan's scratch
directory (``adapters.scratch``), deleted with it when the run ends.
"""

from __future__ import annotations

import logging
import secrets
import time
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.csv_chunks import read_chunk
from adapters.ledger import Ledger
from adapters.row_facts import ROW_DTYPE, RowFacts, chunk_rows
from adapters.scratch import Scratch, Spill
from embedline.errors import EmbedlineError
from embedline.keys import dims_text
from embedline.models import ChunkOutcome, ChunkSpec, InputPlan, ReusePlan, ReuseSource
from embedline.protocols import ObjectStore
from tasks.embed.paid import chunk_name, mark_gave_up
from tasks.reuse.chunk_side import forget_failures, note_failed
from tasks.reuse.gather import Gathered, gather
from tasks.reuse.row_sources import JoinResult, join_run, read_waits, refresh_index

__all__ = ["ReuseStage"]

Log = logging.Logger | logging.LoggerAdapter[logging.Logger]
_NO_HEIR = np.iinfo(np.uint32).max
_INDEX_BATCH = 64  # objects indexed per ledger transaction


class ReuseStage:
    """One run's reuse stage (module docstring). Build it, call ``prepare(todo)`` once,
    then ``plan_for(spec)`` for each chunk submitted and ``note_failed(index)`` for each
    chunk that will not publish; ``close()`` at the end.

    ``length``: the run's vector length when known (vectors of another length are not
    copied). ``reuse`` False: no earlier run's vectors (in-run deduplication and this run's
    kept requests still apply). ``scratch_root``: where to plan row hashes when the input
    plan has none (a plan made without a scratch directory). ``shared_disk`` False (chunk
    tasks on a Dask cluster elsewhere): plans carry the copied vectors, not their path.
    """

    def __init__(
        self,
        *,
        store: ObjectStore,
        ledger: Ledger,
        plan: InputPlan,
        run_key: str,
        model: str,
        dimensions: int | None,
        reuse: bool,
        length: int | None,
        scratch_root: str,
        log: Log,
        shared_disk: bool = True,
    ) -> None:
        self.shared_disk = shared_disk
        self.store, self.ledger, self.plan, self.run_key = store, ledger, plan, run_key
        self.model, self.dimensions, self.reuse, self.length = model, dimensions, reuse, length
        self.log, self.session = log, secrets.token_hex(8)
        self._own: Scratch | None = None
        if plan.scratch is None:
            self._own = Scratch.create(scratch_root)
        # _own is set just above when plan.scratch is None
        base = Path(plan.scratch) if plan.scratch is not None else self._own.path  # type: ignore[union-attr]
        self.directory = base / f"reuse-{self.session}"
        self._specs: dict[int, ChunkSpec] = {}
        self._joined: JoinResult | None = None
        self._gathered: Gathered | None = None
        self._waits: dict[int, np.ndarray] = {}
        self.said: list[str] = []  # the info lines prepare logged
        forget_failures()

    def prepare(self, todo: list[ChunkSpec]) -> None:
        """Index the store (when reuse is on), plan every row of ``todo`` and copy the
        vectors; logs ``reuse stage: N rows from M objects in S s``.

        :raises DiskFullError: the scratch filesystem is full.
        :raises RetryableError, FatalError: the store failed.
        """
        self._specs = {s.index: s for s in todo}
        if not todo:
            return
        started = time.monotonic()
        if self.reuse:
            added = refresh_index(self.store, self.ledger)
            self._say(
                "reuse index: %d new chunk objects indexed in %.1f s",
                added,
                time.monotonic() - started,
            )
        rows = self._row_hashes(todo)
        self._joined = join_run(
            directory=self.directory,
            rows=rows,
            todo=todo,
            chunks_total=len(self.plan.chunks),
            ledger=self.ledger,
            store=self.store,
            model=self.model,
            dimensions=self.dimensions,
            reuse=self.reuse,
            run_key=self.run_key,
        )
        self._gathered = gather(
            self.store,
            self._joined,
            self.directory,
            length=self.length,
            chunks_total=len(self.plan.chunks),
        )
        got = self._gathered
        self._say(
            "reuse stage: %s rows from %s objects in %.1f s (the index, the join and "
            "the copy; %s rows wait for an earlier chunk of this run)",
            f"{got.rows:,}",
            f"{got.sources_read:,}",
            time.monotonic() - started,
            f"{self._joined.waiting:,}",
        )

    def texts_to_send(self, todo: list[ChunkSpec]) -> tuple[JoinResult, np.ndarray]:
        """A dry run's half of ``prepare``: the index refreshed (reuse on: new chunk objects
        of the output are added to the ledger's reuse index, a local cache) and every row of
        ``todo`` joined, but no vector copied. Returns the join and the owner row of each
        distinct text left to send, as (chunk index, position) pairs (``int64``, shape
        ``(n, 2)``), sorted.

        :raises DiskFullError: the scratch filesystem is full.
        :raises RetryableError, FatalError: the store failed.
        """
        self._specs = {s.index: s for s in todo}
        if self.reuse and todo:
            refresh_index(self.store, self.ledger)
        joined = join_run(
            directory=self.directory,
            rows=self._row_hashes(todo),
            todo=todo,
            chunks_total=len(self.plan.chunks),
            ledger=self.ledger,
            store=self.store,
            model=self.model,
            dimensions=self.dimensions,
            reuse=self.reuse,
            run_key=self.run_key,
            keep_owners=True,
        )
        owners = np.concatenate([*(joined.owners or []), np.empty((0, 2), dtype=np.int64)])
        owners = owners.astype(np.int64)
        return joined, owners[np.lexsort((owners[:, 1], owners[:, 0]))]

    def fully_copied(self, spec: ChunkSpec) -> bool:
        """Whether every non-empty row of ``spec`` has a copied vector (none to send, none
        to wait for; a copy that fails its full-hash check is still sent by the task)."""
        if self._joined is None or self._gathered is None or spec.index not in self._specs:
            return False
        nonempty = int(self._joined.nonempty[spec.index])
        return (
            nonempty > 0
            and spec.index not in self._joined.chunks_waiting
            and int(self._gathered.copied[spec.index]) >= nonempty
        )

    def rows_to_send(self, spec: ChunkSpec) -> int:
        """The rows of ``spec`` with no copied vector: its non-empty rows less those copied
        (rows waiting for an earlier chunk of the run count as sent). A chunk the stage did
        not prepare sends all its rows. Sizes the chunk task groups (``tasks.embed.groups``)."""
        if self._joined is None or self._gathered is None or spec.index not in self._specs:
            return spec.rows
        nonempty = int(self._joined.nonempty[spec.index])
        return max(0, nonempty - int(self._gathered.copied[spec.index]))

    def plan_for(self, spec: ChunkSpec) -> ReusePlan:
        """The chunk's ``ReusePlan``: its copied vectors' file and the in-run owners its
        rows wait for. Chunks the stage did not prepare (redone for another vector length)
        get an empty plan: they send every row."""
        if self._joined is None or self._gathered is None or spec.index not in self._specs:
            return ReusePlan(session=self.session)
        waits = read_waits(self._joined.waits, spec.index, self._waits)
        path = self._gathered.file(spec.index)
        if path is not None and not self.shared_disk:
            return ReusePlan(
                self._sources(waits),
                session=self.session,
                width=self._gathered.width,
                copies=Path(path).read_bytes(),
            )
        return ReusePlan(
            self._sources(waits), session=self.session, prefill=path, width=self._gathered.width
        )

    def note_failed(self, index: int) -> None:
        """Chunk ``index`` will not publish in this run: chunks waiting for it take what it
        kept and its heirs embed the rest (``tasks.reuse.chunk_side``); tasks of this process are
        told at once, tasks elsewhere (Dask) by a gave-up mark in the store."""
        spec = self._specs.get(index)
        if spec is None:
            return
        note_failed(spec.object_key)
        mark_gave_up(self.store, self.run_key, chunk_name(spec.object_key), self.session)

    def index_published(self, outcomes: Iterable[ChunkOutcome]) -> int:
        """Add the chunk objects this run published to the reuse index, from planning's rows
        (the objects hold every row but their dead letters, in order), so the next run need
        not read them back to index them (0.7 s of CPU for a 1M-row night on a local disk, a
        ranged read per object on S3). Returns how many were added; without
        planning's rows (no scratch directory) or with reuse off, none.

        Memory: ``_INDEX_BATCH`` objects' text hashes at most (about 22 MB at 5,000 rows a
        chunk); they are written to the ledger a batch at a time: holding every object's
        until the end would make the CLI's peak grow with the rows (+680 MB at 10M rows).

        :raises DiskFullError: the ledger's filesystem is full.
        """
        if not self.reuse or self.plan.scratch is None:
            return 0
        dims = dims_text(self.dimensions)
        added, batch = 0, []
        for outcome in outcomes:
            hashes = self._published_hashes(outcome)
            if hashes is None:
                continue
            batch.append((outcome.object_key, self.model, dims, hashes))
            added += 1
            if len(batch) >= _INDEX_BATCH:
                self.ledger.index_objects(self.store.uri, batch)
                batch = []
        if batch:
            self.ledger.index_objects(self.store.uri, batch)
        return added

    def _published_hashes(self, outcome: ChunkOutcome) -> pa.Array | None:
        """The text hashes of ``outcome``'s object, row by row, from planning's rows; None
        when the object is not the one planned (the next run indexes it from the object)."""
        spec = self._specs.get(outcome.index)
        if spec is None or spec.object_key != outcome.object_key:
            return None
        assert self.plan.scratch is not None
        try:
            hashes = chunk_rows(self.plan.scratch, spec.index).column("text_sha256")
        except (OSError, IndexError):
            return None
        gone = np.array(
            [d.row_number - spec.first_row for d in outcome.dead_letters], dtype=np.int64
        )
        keep = np.ones(len(hashes), dtype=bool)
        keep[gone[(gone >= 0) & (gone < len(hashes))]] = False
        if int(keep.sum()) != outcome.rows:
            return None
        return hashes.filter(pa.array(keep))

    def close(self) -> None:
        """Delete the stage's files (and its own scratch directory, if it made one)."""
        if self._own is not None:
            self._own.close()

    # ── internals ────────────────────────────────────────────────────────────────────────
    def _say(self, message: str, *args: Any) -> None:
        """Log an info line of ``prepare`` and keep it (``said``): a stage prepared before
        the flow started is adopted by the flow, whose log says them again."""
        self.log.info(message, *args)
        self.said.append(message % args)

    def _row_hashes(self, todo: list[ChunkSpec]) -> Spill:
        """Planning's spill of text hashes, or (a plan made without one) the same read from
        the chunks to embed."""
        if self.plan.scratch is not None:
            return Spill(Path(self.plan.scratch) / "rows", ROW_DTYPE)
        assert self._own is not None
        facts = RowFacts(self._own)
        for spec in todo:
            try:
                rows = read_chunk(self.plan.source, spec)
            except EmbedlineError:
                continue  # the chunk task reports it
            facts.add_chunk(
                spec.index,
                [r.id for r in rows],
                [r.text_sha256 for r in rows],
                array("i", (len(r.text.encode("utf-8")) for r in rows)),
                [p for p, r in enumerate(rows) if not r.text.strip()],
            )
        facts.finish()
        assert facts.rows is not None
        return facts.rows

    def _sources(self, waits: np.ndarray) -> tuple[ReuseSource, ...]:
        """``waits`` records (one chunk's) as sources: one per owner, heirs per row."""
        by_owner: dict[int, list[Any]] = {}
        for record in waits:
            by_owner.setdefault(int(record["owner"]), []).append(record)
        sources = []
        for owner, records in by_owner.items():
            heirs = tuple(
                tuple(self._key(int(h)) for h in r["heirs"] if int(h) != _NO_HEIR) for r in records
            )
            sources.append(
                ReuseSource(
                    self._key(owner),
                    tuple(int(r["position"]) for r in records),
                    heirs if any(heirs) else (),
                )
            )
        return tuple(sources)

    def _key(self, index: int) -> str:
        return self._specs[index].object_key
