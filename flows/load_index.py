"""A load's last stage: the sink's index, built (or compacted) in its own ``build-index`` task
run with its progress in the progress artifact, or deferred with ``--index later``
(``embedline index TARGET`` builds it then; docs/reference/sinks.md, "The pgvector index").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Literal

from prefect import get_run_logger

from embedline.protocols import VectorSink
from embedline.shutdown import STOP
from embedline.summary import LoadSummary
from flows.artifacts import ProgressArtifact
from tasks.load.task import build_index

__all__ = ["index_stage"]


def index_stage(
    summary: LoadSummary,
    sink: VectorSink,
    index: Literal["now", "later"],
    keep_versions_s: float | None,
    show: Callable[[str, str], None],
) -> LoadSummary:
    """Build the sink's index (or compact it) in the ``build-index`` task run, timed: its
    own line in the summary, so a long HNSW build is not taken for a hang (or for
    Prefect's start-up). With ``index`` ``later``: nothing built, the summary says how to.
    ``keep_versions_s``: LanceDB versions kept (seconds; ``flows.load.load_run``);
    ``show(stage, phrase)`` gets the progress artifact's ``index`` line.

    :raises EmbedlineError: the sink failed (see ``VectorSink.finalize``).
    """
    logger = get_run_logger()
    if index == "later":
        state = f"deferred (--index later): embedline index '{sink.identity}' builds it"
        logger.info("%s: index %s", sink.identity, state)
        show("index", state)
        return replace(summary, index_s=0.0, index_state=state)
    started = time.monotonic()
    show("index", "building or compacting (the sink's finalize step)")
    with _build_progress(sink):
        state = build_index(sink.identity, keep_versions_s)
    seconds = round(time.monotonic() - started, 3)
    logger.info("%s: %s in %.1f s", sink.identity, state, seconds)
    show("index", f"{state} in {seconds:.1f} s")
    return replace(summary, index_s=seconds, index_state=state)


@contextlib.contextmanager
def _build_progress(sink: VectorSink) -> Iterator[None]:
    """While a pgvector index builds, its progress (rows done of rows) in the progress
    artifact (``embedline-progress``, a new version starting at 0 %, 100 % once built), as
    the chunks' was."""
    from adapters.sinks.pgvector import PgVectorSink  # the store's module, only for it

    if not isinstance(sink, PgVectorSink) or STOP.report.api_lost() is not None:
        yield
        return
    artifact = ProgressArtifact(description=f"{sink.identity}: HNSW index build, rows done")
    sink.on_progress = artifact.update
    try:
        yield
        artifact.update(1, 1)
    finally:
        sink.on_progress = None
        artifact.close()
