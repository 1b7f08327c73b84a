"""``embedline index TARGET``: build a sink's index apart from its load (after ``run``/``load
--index later``, or after a build the server cancelled).

Needs no Prefect: it opens the sink and calls its ``finalize`` (pgvector: the HNSW index,
``adapters.sinks.pg_index``), printing one line while the build runs and one when it ends.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from cli.arguments import HELP_FORMATTER
from cli.failures import EXIT_USAGE, fail

__all__ = ["add_parsers"]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``index``."""
    index = sub.add_parser(
        "index",
        help="build a sink's index (after a load with --index later)",
        formatter_class=HELP_FORMATTER,
    )
    index.add_argument(
        "target",
        metavar="TARGET",
        help="the sink, as `load --to` names it (postgresql://user@host/db?table=NAME, "
        "lancedb://PATH?table=NAME, …); an alias builds the index of the table it "
        "points at",
    )
    index.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between the build's progress lines (stderr)",
    )
    index.set_defaults(handler=_index, resumable=False)


def _index(args: argparse.Namespace) -> int:
    """Build the index: one line of progress (stderr), then ``index  STATE in N s``; exit 0
    (also when it was already there), 1 when the server failed or cancelled it, 3 when it
    refused it."""
    from adapters.sinks import open_sink, validate_sink_uri
    from embedline.errors import EmbedlineError, InputError
    from embedline.progress import PROGRESS_LOGGER

    try:
        validate_sink_uri(args.target)
    except InputError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    shown = logging.StreamHandler(sys.stderr)
    shown.setFormatter(logging.Formatter("%(message)s"))
    progress = logging.getLogger(PROGRESS_LOGGER)
    progress.addHandler(shown)
    progress.setLevel(logging.INFO)
    sink = open_sink(args.target)
    if hasattr(sink, "progress_interval_s"):
        sink.progress_interval_s = max(args.progress_interval, 0.05)
    started = time.monotonic()
    try:
        if sink.describe() is None:
            return fail(f"embedline: error: {sink.identity}: no such table", EXIT_USAGE)
        state = sink.finalize()
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    finally:
        sink.close()
        progress.removeHandler(shown)
    print(f"sink       {sink.identity}")
    print(f"index      {state} in {time.monotonic() - started:.1f} s")
    return 0
