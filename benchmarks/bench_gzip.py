#!/usr/bin/env python3
"""Chunk reads of a ``.csv.gz`` input against the same plain CSV, in one run on one machine.

A chunk task reads its rows by byte range (``InputFile.read_range``). For a plain file that
is a seek; gzip cannot seek. The script plans the input (``plan_csv``, chunks of
``--chunk-size`` rows), then reads every chunk's byte range three ways and times each:

- ``plain``: ``LocalInput.read_range`` on the uncompressed file (the floor);
- ``gzip-index``: ``GzipInput.read_range``, which resumes from ``GzipIndex`` checkpoints;
- ``gzip-from-start``: inflate from byte 0 up to each range (what embedline did before
  ``GzipIndex``; kept here as the baseline).

Chunks are read in a shuffled order (a fixed seed), as concurrent tasks finish out of
order. Prints seconds and ratios to ``plain``; numbers, never a timed assertion. Usage::

    python benchmarks/bench_gzip.py [--data PATH] [--chunk-size 1000]
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from adapters.csv_source import plan_csv  # noqa: E402
from adapters.input_source import open_input  # noqa: E402


def _from_start(path: Path, start: int, stop: int) -> bytes:
    with gzip.open(path, "rb") as fh:
        fh.read(start)  # gzip seeks forward by inflating and discarding
        return fh.read(stop - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="input CSV (default: the English file vendored in tests/data)",
    )
    parser.add_argument("--chunk-size", type=int, default=1000)
    args = parser.parse_args()
    if args.data is None:
        from tests.support.real_data import ENGLISH_NAME, real_csv

        args.data = real_csv(ENGLISH_NAME)
    if not args.data.is_file():
        parser.error(f"no input at {args.data}: pass --data PATH")
    with tempfile.TemporaryDirectory() as tmp:
        packed = Path(tmp) / (args.data.name + ".gz")
        packed.write_bytes(gzip.compress(args.data.read_bytes(), compresslevel=6))
        plan = plan_csv(
            str(args.data),
            id_column="id",
            text_column="text",
            codec="auto",
            delimiter=",",
            chunk_size=args.chunk_size,
            model="m",
            dimensions=None,
        )
        ranges = [(c.byte_start, c.byte_stop) for c in plan.chunks]
        random.Random(0).shuffle(ranges)
        plain, gz = open_input(str(args.data)), open_input(str(packed))
        readers = {
            "plain": lambda a, b: plain.read_range(a, b),
            "gzip-index": lambda a, b: gz.read_range(a, b),
            "gzip-from-start": lambda a, b: _from_start(packed, a, b),
        }
        seconds, expected = {}, [plain.read_range(a, b) for a, b in ranges]
        for name, read in readers.items():
            started = time.perf_counter()
            got = [read(a, b) for a, b in ranges]
            seconds[name] = time.perf_counter() - started
            assert got == expected, f"{name} read other bytes"
        packed_bytes = packed.stat().st_size
    print(
        f"{args.data.name}: {plan.bytes:,} bytes ({packed_bytes:,} gzipped), "
        f"{len(ranges)} chunks of {args.chunk_size} rows, read in shuffled order"
    )
    print(f"{'reader':<16} {'seconds':>8} {'x plain':>8}")
    for name, value in seconds.items():
        print(f"{name:<16} {value:8.3f} {value / seconds['plain']:8.1f}")
    ratio = seconds["gzip-from-start"] / seconds["gzip-index"]
    print(f"gzip-from-start / gzip-index: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
