"""The load's progress lines from inside a sink (an HNSW build's) reach the user."""

from __future__ import annotations

import logging


def test_a_sinks_progress_lines_are_shown_once_the_load_flow_is_imported() -> None:
    """Prefect copies its handlers to the ``embedline`` logger but no level: before this, an
    index build's INFO lines were dropped and a 41 s build printed nothing."""
    import flows.load  # noqa: F401
    from adapters.sinks import pg_index
    from embedline.progress import PROGRESS_LOGGER

    assert pg_index.progress_logger.name == PROGRESS_LOGGER
    assert pg_index.progress_logger.isEnabledFor(logging.INFO)
