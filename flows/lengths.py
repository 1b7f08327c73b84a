"""The dispatcher's second pass: published chunks whose vectors are not the run's length.

Orchestration only (the rule is ``tasks/publish/dimensions.py``). After the first pass the run knows
its length (docs/reference/failure-classes.md): the chunks of another length, published before the
first answer was seen or by an older run whose server answered another length, are embedded again as
their next generation (``chunks/{key}.g{N}.parquet``,
docs/reference/output-layout.md, "Generations"), each told the length, so a run
commits one length or nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from adapters.ledger import Ledger
from embedline.models import ChunkOutcome, InputPlan, chunk_generation
from embedline.protocols import ObjectStore
from embedline.shutdown import STOP
from flows.dispatch import Dispatcher
from flows.signals import dispatch_with_graceful_stop
from tasks.publish.dimensions import RunLength, other_lengths, with_lengths

__all__ = ["redo_other_lengths"]


def redo_other_lengths(
    dispatcher: Dispatcher,
    *,
    store: ObjectStore,
    plan: InputPlan,
    skipped: dict[int, ChunkOutcome],
    length: RunLength,
    grace_s: float,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> list[int]:
    """Dispatch again, as their next generation, the published chunks (``skipped`` ones and
    those of ``dispatcher.result``) whose vectors are not ``length.decide(...)`` long;
    return their indexes. They leave ``skipped`` and ``published`` first, so one that fails
    again is not published for the summary. Nothing when the run is stopping.

    When nothing was sent in this run (the length came from the published rows), that
    length is pinned for the second pass: every answer must have it.
    """
    result = dispatcher.result
    stopping = STOP.dispatch.stop_signal() is not None or STOP.report.api_lost() is not None
    if result.stop is not None or stopping:
        return []
    done = with_lengths(store, {**skipped, **result.published})
    skipped.update({i: done[i] for i in skipped})  # lengths read once: the commit needs them
    target = length.decide(done.values())
    off = other_lengths(done, target)
    if not off or target is None:
        return []
    if length.current() is None:
        length.pinned = target
    ledger: Ledger = dispatcher.ledger
    specs = []
    for index in off:
        generation = chunk_generation(done[index].object_key) + 1
        specs.append(replace(plan.chunks[index], generation=generation))
        ledger.reopen(dispatcher.run_key, index)
        skipped.pop(index, None)
        result.published.pop(index, None)
    logger.warning(
        "%d published chunks hold vectors of another length than the run's %d dimensions "
        "(chunk %d: %s): embedding them again as their next generation",
        len(off),
        target,
        off[0],
        done[off[0]].dimensions,
    )
    dispatch_with_graceful_stop(dispatcher, specs, grace_s=grace_s, logger=logger)
    return off
