#!/usr/bin/env python3
"""Deterministic synthetic exports for the scale benchmarks, built from the vendored Debian
English texts (``tests.support.real_data.real_csv(ENGLISH_NAME)``).

Row ``k`` (0-based) of the base export is a pure function of ``k``:

- ``id``: ``r`` and ``k`` in nine digits (``r000001234``): unique, sortable strings;
- ``text``: the Debian text of row ``k mod 63,905``, padded with the texts after it when
  shorter than ``BASE_TEXT_BYTES`` and cut there (at a UTF-8 character boundary), then the
  suffix `` [row k]``, so every row's text is distinct (the Debian file holds duplicates and
  one empty text; here every text is non-empty and unique). About 320 bytes a CSV record.

Variants (each streams; memory stays flat in the row count, except ``shuffled``'s
permutation array, 4 bytes a row):

- ``base``: rows 0 .. N-1 in order;
- ``shuffled``: the same rows in a seeded random order (every text the base has);
- ``deleted10``: the base without 10 % of its rows (chosen by a hash of ``k``), order kept;
- ``changed``: the base with a fraction (``--fraction``, default 0.001) of its texts edited
  (the suffix becomes `` [row k, TAG]``, ``--tag`` default ``edited``), chosen by a hash of
  ``k``; the rest identical, order kept. The rows a smaller fraction edits are among those a
  larger one edits, so a night of another tag edits every chosen row again.

The bench scripts import ``row_id``, ``row_text``, ``row_indices`` and ``write_export``; the
command line writes one file::

    python benchmarks/synthetic.py ROWS OUT.csv [--variant base|shuffled|deleted10|changed]
        [--fraction 0.001] [--tag edited] [--seed 24]
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS = ("base", "shuffled", "deleted10", "changed")
BASE_TEXT_BYTES = 290  # + the suffix, the id and the CSV punctuation: about 320 bytes a row
MAX_ROWS = 999_999_999  # the id's nine digits
DEFAULT_SEED = 24
DEFAULT_FRACTION = 0.001
DEFAULT_TAG = "edited"

_MASK = (1 << 64) - 1


def _mix(k: int, salt: int) -> int:
    """A 64-bit hash of ``k`` (splitmix64's finalizer): cheap, deterministic, well spread."""
    z = (k * 0x9E3779B97F4A7C15 + salt) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _trim_utf8(text: str, limit: int) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore")


@functools.cache
def debian_texts() -> tuple[str, ...]:
    """The base texts: each Debian English text padded with the ones after it (wrapping
    around) to at least ``BASE_TEXT_BYTES`` UTF-8 bytes, then cut to exactly that (or just
    under it, at a character boundary), trailing whitespace stripped."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # tests.support: not part of the installed package
    from tests.support.real_data import ENGLISH_NAME, real_csv

    csv.field_size_limit(64 * 1024 * 1024)
    with real_csv(ENGLISH_NAME).open(encoding="utf-8", newline="") as fh:
        raw = [row["text"] for row in csv.DictReader(fh)]
    out = []
    for j in range(len(raw)):
        text, nxt = raw[j].strip(), j
        while len(text.encode("utf-8")) < BASE_TEXT_BYTES:
            nxt = (nxt + 1) % len(raw)
            text = (text + "\n" + raw[nxt].strip()).strip()
        out.append(_trim_utf8(text, BASE_TEXT_BYTES).rstrip())
    return tuple(out)


def row_id(k: int) -> str:
    return f"r{k:09d}"


def row_index(row: str) -> int:
    """``k`` of an id made by ``row_id``."""
    return int(row[1:])


def is_deleted(k: int) -> bool:
    """Whether ``deleted10`` leaves row ``k`` out (10 % of rows, by a hash of ``k``)."""
    return _mix(k, 0xDE1) % 10 == 0


def is_changed(k: int, fraction: float = DEFAULT_FRACTION) -> bool:
    """Whether ``changed`` edits row ``k``'s text (``fraction`` of the rows, by a hash)."""
    return _mix(k, 0xC4A) % 1_000_000 < round(fraction * 1_000_000)


def row_text(k: int, *, edited: bool = False, tag: str = DEFAULT_TAG) -> str:
    texts = debian_texts()
    return f"{texts[k % len(texts)]} [row {k}{', ' + tag if edited else ''}]"


def permutation(rows: int, seed: int = DEFAULT_SEED):  # -> numpy int32/int64 array
    """The ``shuffled`` order: a seeded permutation of ``range(rows)`` (int32 while it fits:
    4 bytes a row)."""
    import numpy as np

    order = np.arange(rows, dtype=np.int32 if rows < 2**31 else np.int64)
    np.random.default_rng(seed).shuffle(order)
    return order


def row_indices(rows: int, variant: str, seed: int = DEFAULT_SEED) -> Iterator[int]:
    """The base row numbers ``k`` the variant holds, in file order."""
    if variant == "shuffled":
        order = permutation(rows, seed)
        for start in range(0, rows, 65_536):
            yield from order[start : start + 65_536].tolist()
    elif variant == "deleted10":
        yield from (k for k in range(rows) if not is_deleted(k))
    elif variant in ("base", "changed"):
        yield from range(rows)
    else:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")


def text_of(
    k: int, variant: str, fraction: float = DEFAULT_FRACTION, tag: str = DEFAULT_TAG
) -> str:
    """Row ``k``'s text as the variant holds it."""
    return row_text(k, edited=variant == "changed" and is_changed(k, fraction), tag=tag)


def write_export(
    rows: int,
    dest: Path,
    variant: str = "base",
    *,
    fraction: float = DEFAULT_FRACTION,
    tag: str = DEFAULT_TAG,
    seed: int = DEFAULT_SEED,
) -> dict[str, int]:
    """Write the variant of the ``rows``-row base export to ``dest`` (header ``id,text``, LF
    records, UTF-8 without BOM), streaming. Returns ``{"rows": records written, "bytes": file
    size, "edited": texts edited}``."""
    if not 0 < rows <= MAX_ROWS:
        raise ValueError(f"rows must be in 1..{MAX_ROWS:,}, got {rows}")
    texts = debian_texts()
    n = len(texts)
    written = edited = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    with partial.open("w", encoding="utf-8", newline="", buffering=1 << 20) as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(("id", "text"))
        batch: list[tuple[str, str]] = []
        for k in row_indices(rows, variant, seed):
            change = variant == "changed" and is_changed(k, fraction)
            edited += change
            batch.append((f"r{k:09d}", f"{texts[k % n]} [row {k}{', ' + tag if change else ''}]"))
            if len(batch) == 8192:
                out.writerows(batch)
                written += len(batch)
                batch.clear()
        out.writerows(batch)
        written += len(batch)
    partial.replace(dest)
    return {"rows": written, "bytes": dest.stat().st_size, "edited": edited}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=int, help="rows of the base export (1 .. 999,999,999)")
    parser.add_argument("out", type=Path, help="the CSV to write")
    parser.add_argument("--variant", choices=VARIANTS, default="base")
    parser.add_argument(
        "--fraction",
        type=float,
        default=DEFAULT_FRACTION,
        help="share of texts edited by --variant changed (default 0.001)",
    )
    parser.add_argument(
        "--tag", default=DEFAULT_TAG, help="what --variant changed appends (default 'edited')"
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="seed of --variant shuffled's order"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    done = write_export(
        args.rows, args.out, args.variant, fraction=args.fraction, tag=args.tag, seed=args.seed
    )
    print(
        f"{args.out}: {done['rows']:,} rows, {done['bytes']:,} bytes "
        f"({done['bytes'] / max(done['rows'], 1):.0f} a row), {done['edited']:,} edited, "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
