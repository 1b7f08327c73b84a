"""Helpers of the Batch API tests: a run that must end within a bound, and an ``id,text``
input of numbered rows."""

from __future__ import annotations

import csv
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["within", "write_csv"]


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Raise ``TimeoutError`` in a run that does not end within ``seconds`` (SIGALRM: the
    main thread only), instead of waiting for ever on a wait that cannot end."""

    def expired(*_: object) -> None:
        raise TimeoutError(f"the run did not end within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def write_csv(path: Path, texts: list[str]) -> list[tuple[str, str]]:
    """Write ``texts`` as rows ``r000``, ``r001``, … of an ``id,text`` CSV; return the rows."""
    rows = [(f"r{i:03d}", t) for i, t in enumerate(texts)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        writer.writerows(rows)
    return rows
