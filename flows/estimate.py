"""A dry run (``embedline run --dry-run``, the flow's ``dry_run``): what a run would send and
what it would cost, without a request or a write.

    open (plan; a delta night decides which rows it writes) → chunks published before
    (ledger, else the store) → the reuse stage's join (reuse index, this run's kept
    requests, duplicates within the run) → the distinct texts left to send, read back from
    the input and their tokens estimated → cost at the synchronous and the Batch API price

Nothing is sent, nothing is written to the output (it is not even created), no run is
recorded in the ledger. The ledger is read if it exists (else an in-memory one stands in):
the reuse index, a cache of what the output's objects hold, may gain the objects it did not
know yet, and chunks found only in the store are noted, as a run would. Scratch files are
the plan's and go with it.

Tokens are *estimated*, no tokenizer ships with embedline: by script
(``adapters.embeddings.approximate_tokens``), then scaled by what this endpoint reported for
this model in earlier runs once enough tokens back the ratio (``embedline.calibration``, the
ledger's ``token_calibration``). ``--max-cost`` (``adapters.embeddings.spend``) caps what is
actually spent, as the server reports it.

Prefect-free, like ``flows.run``: the CLI calls it before Prefect starts; the flow wraps it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from adapters.csv_chunks import read_chunk
from adapters.embeddings import approximate_tokens
from adapters.ledger import Ledger
from embedline.calibration import FIRST_RUN_METHOD, calibrated
from embedline.models import InputPlan
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from embedline.summary import BATCH_PRICE_FACTOR, usd
from flows.run import Run
from tasks.plan.published import find_published
from tasks.reuse.stage import Log, ReuseStage

__all__ = ["ESTIMATE_METHOD", "Estimate", "estimate_run"]

#: How the token counts of a first run are made (said with every uncalibrated estimate).
ESTIMATE_METHOD = FIRST_RUN_METHOD


@dataclass(slots=True)
class Estimate:
    """What a run of these settings would send. Rows: ``rows_total`` in the input,
    ``rows_inherited`` unchanged since the last committed run (a delta night writes them
    not at all), ``rows_published`` in chunks this run published before (a rerun),
    ``rows_to_write`` in the chunks left, of which ``rows_reused`` copy a vector the output
    holds (or a request this run kept), ``rows_duplicate`` repeat a text another row of
    the run sends, ``rows_empty`` are empty texts (never sent); ``rows_empty_unwritten`` are
    the empty texts a delta night writes to no chunk (outside ``rows_to_write``, so the four
    counts add up to ``rows_total``); a delta night's change set against the run
    ``base_run_key``: ``added``, ``changed``, ``removed`` rows; ``new_texts`` distinct texts
    to send, ``tokens`` their estimated tokens (``method``). Cost in USD, None without a
    price: ``cost`` synchronous, ``cost_batch`` with the Batch API. ``committed``: the run
    is already committed (nothing to send)."""

    run_key: str | None
    rows_total: int
    rows_inherited: int = 0
    rows_published: int = 0
    rows_to_write: int = 0
    rows_reused: int = 0
    rows_duplicate: int = 0
    rows_empty: int = 0
    rows_empty_unwritten: int = 0
    base_run_key: str | None = None
    added: int = 0
    changed: int = 0
    removed: int = 0
    new_texts: int = 0
    tokens: int = 0
    chunks_to_send: int = 0
    price_per_million_tokens: float | None = None
    cost: float | None = None
    cost_batch: float | None = None
    committed: bool = False
    method: str = ESTIMATE_METHOD
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """The estimate as a JSON-ready dict (the flow's result)."""
        return asdict(self)

    def lines(self) -> list[str]:
        """What ``embedline run --dry-run`` prints: the ``estimate`` line first
        (docs/guide/running.md, "Cost before you pay")."""
        price = self.price_per_million_tokens
        if price is None:
            cost = "no price given (--price-per-million-tokens)"
        else:
            cost = (
                f"{usd(self.cost or 0.0)} at ${price:g} per 1M tokens, "
                f"{usd(self.cost_batch or 0.0)} with the Batch API"
            )
        lines = [
            f"estimate   {self.tokens:,} tokens for {self.new_texts:,} new texts, {cost}",
            f"tokens     {self.method}",
            f"rows       {self.rows_total:,} in the input: {self.rows_inherited:,} unchanged "
            f"since the last committed run, {self.rows_published:,} already published, "
            f"{self.rows_to_write:,} to write"
            + (
                f", {self.rows_empty_unwritten:,} empty texts (never sent)"
                if self.rows_empty_unwritten
                else ""
            ),
            f"to write   {self.rows_to_write:,} rows: {self.rows_reused:,} reused, "
            f"{self.rows_duplicate:,} duplicates of another row, {self.rows_empty:,} empty, "
            f"{self.new_texts:,} new texts to send in {self.chunks_to_send:,} "
            + ("chunk" if self.chunks_to_send == 1 else "chunks"),
        ]
        if self.base_run_key:
            lines.append(
                f"changes    {self.added:,} added, {self.changed:,} changed, "
                f"{self.removed:,} removed against run {self.base_run_key[:12]} (a delta night)"
            )
        if self.committed:
            lines.append("run        already committed: nothing to send")
        lines.append("dry run    nothing sent, nothing written")
        return lines

    def markdown(self) -> str:
        """The estimate as the ``embedline-estimate`` artifact: a table, no strikethrough
        (no ``~``)."""
        rows = [line.split(None, 1) for line in self.lines()]
        body = "\n".join(f"| {k} | {v} |" for k, v in rows)
        return f"# Dry run: cost before you pay\n\n| | |\n|---|---|\n{body}\n"


def estimate_run(
    settings: RunSettings,
    *,
    store: ObjectStore,
    plan_input: Callable[[RunSettings], InputPlan],
    log: Log | None = None,
) -> Estimate | tuple[str, int]:
    """The dry run of ``settings`` (module docstring): its ``Estimate``, or (one-line
    message, exit code) when the run could not start (an input or store error).

    :raises DiskFullError: the scratch filesystem is full.
    :raises RetryableError, FatalError: the store failed while it was read.
    """
    from flows.run import RunRefused

    started = time.monotonic()
    log = log or logging.getLogger("embedline.run")
    try:
        run = Run.open(
            settings,
            store=store,
            plan_input=plan_input,
            log=log,
            started=started,
            prepare_output=False,
        )
    except RunRefused as refused:
        return refused.summary.message, refused.summary.exit_code
    try:
        estimate = _estimate(run, settings)
    finally:
        run.discard_scratch()
    estimate.wall_s = round(time.monotonic() - started, 3)
    return estimate


def _estimate(run: Run, settings: RunSettings) -> Estimate:
    plan, delta = run.plan, run.plan.delta
    inherited = delta.rows_inherited if delta is not None else 0
    estimate = Estimate(
        run.run_key,
        rows_total=inherited
        + sum(c.rows for c in plan.chunks)
        + (delta.rows_empty if delta else 0),
        rows_inherited=inherited,
        price_per_million_tokens=settings.price_per_million_tokens,
    )
    if run.committed is not None:
        estimate.committed = True
        estimate.rows_published = estimate.rows_total - inherited
        return _priced(estimate)
    exists = os.path.exists(settings.ledger)
    ledger = Ledger(settings.ledger if exists else ":memory:")
    try:
        skipped = find_published(
            plan,
            run_key=run.run_key,
            ledger=ledger,
            store=run.store,
            model=settings.effective_model,
        )
        todo = [c for c in plan.chunks if c.index not in skipped]
        estimate.rows_published = sum(plan.chunks[i].rows for i in skipped)
        estimate.rows_to_write = sum(c.rows for c in todo)
        if delta is not None:  # empty texts a delta night writes to no chunk
            estimate.rows_empty_unwritten = delta.rows_empty
            estimate.base_run_key = delta.base_run_key
            estimate.added, estimate.changed = delta.added, delta.changed
            estimate.removed = delta.removed
        stage = ReuseStage(
            store=run.store,
            ledger=ledger,
            plan=plan,
            run_key=run.run_key,
            model=settings.effective_model,
            dimensions=settings.dimensions,
            reuse=settings.reuse,
            length=None,
            scratch_root=settings.scratch_root,
            log=run.log,
        )
        try:
            joined, owners = stage.texts_to_send(todo)
        finally:
            stage.close()
        calibration = (
            ledger.calibration(settings.base_url, settings.effective_model)
            if settings.embedder == "openai"
            else None
        )
    finally:
        ledger.close()
    nonempty = int(joined.nonempty.sum())
    estimate.rows_empty += estimate.rows_to_write - nonempty
    estimate.rows_reused = joined.from_index + joined.from_kept
    estimate.new_texts = len(owners)
    estimate.rows_duplicate = nonempty - estimate.rows_reused - estimate.new_texts
    tokens, estimate.chunks_to_send = _tokens(plan, owners)
    estimate.tokens, estimate.method = calibrated(tokens, calibration)
    return _priced(estimate)


def _tokens(plan: InputPlan, owners: np.ndarray) -> tuple[int, int]:
    """(``approximate_tokens``, chunks) of the owner rows ``owners`` ((chunk, position) pairs,
    sorted): each chunk that holds one is read back from the input once."""
    tokens, chunks = 0, 0
    for chunk in np.unique(owners[:, 0]):
        rows = read_chunk(plan.source, plan.chunks[int(chunk)])
        positions = owners[owners[:, 0] == chunk][:, 1]
        tokens += sum(approximate_tokens(rows[int(p)].text) for p in positions)
        chunks += 1
    return tokens, chunks


def _priced(estimate: Estimate) -> Estimate:
    price = estimate.price_per_million_tokens
    if price is not None:
        estimate.cost = estimate.tokens * price / 1e6
        estimate.cost_batch = estimate.cost * BATCH_PRICE_FACTOR
    return estimate
