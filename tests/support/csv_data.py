"""Real Debian data for sink tests: cut the first N records, edit a copy, expected vectors."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np

from tests.support.fake_openai import expected_matrix
from tests.support.real_data import ENGLISH_NAME, real_csv

__all__ = ["ENGLISH", "edit_rows", "expected_vectors", "read_rows", "write_rows"]

ENGLISH = real_csv(ENGLISH_NAME)  # vendored in tests/data (gzip), decompressed once


def read_rows(path: Path, limit: int | None = None) -> list[tuple[str, str]]:
    """``(id, text)`` of the first ``limit`` records (all when None), csv-module parsed."""
    rows: list[tuple[str, str]] = []
    with open(path, newline="", encoding="utf-8") as fh:
        for record in csv.DictReader(fh):
            if limit is not None and len(rows) >= limit:
                break
            rows.append((record["id"], record["text"]))
    return rows


def write_rows(path: Path, rows: list[tuple[str, str]]) -> Path:
    """Write ``id,text`` records (quoted where needed)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["id", "text"])
        writer.writerows(rows)
    return path


def edit_rows(
    rows: list[tuple[str, str]], *, removed: int, changed: int, added: int, seed: int = 7
) -> list[tuple[str, str]]:
    """A nightly re-export: ``removed`` rows dropped, ``changed`` texts edited, ``added``
    new rows appended (ids never seen before)."""
    rng = random.Random(seed)
    picks = rng.sample(range(len(rows)), removed + changed)
    gone, edited = set(picks[:removed]), set(picks[removed:])
    out = [
        (i, f"{t} (edited)" if n in edited else t) for n, (i, t) in enumerate(rows) if n not in gone
    ]
    out += [(f"new-package-{n}", f"A package added tonight, number {n}.") for n in range(added)]
    return out


def expected_vectors(rows: list[tuple[str, str]], dims: int = 384) -> dict[str, np.ndarray]:
    """The fake server's vector for each row whose text is not blank (blank texts are dead
    letters, never sent)."""
    kept = [(i, t) for i, t in rows if t.strip()]
    matrix = expected_matrix([t for _, t in kept], dims)
    return {i: matrix[n] for n, (i, _) in enumerate(kept)}
