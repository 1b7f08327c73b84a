#!/usr/bin/env python3
"""CPU seconds per GB of planning (``plan_csv``) and of reading every chunk back
(``read_chunk``), the code of an older revision against this checkout, in one run.

The input is a synthetic export of at least ``--mb`` MB (default 300) generated from the
vendored English Debian file: the file's rows again and again, each pass with its own ids
(``ID~N``) and texts (a line ``(variant N)`` appended), written into a temporary directory
beside the checkout (``--dir``; removed afterwards) so it lands on the checkout's disk. Each
measurement runs in a fresh interpreter (``_CHILD``) and reports the CPU seconds
(user + system) of the two phases. Three variants, run in turn ``--repeat`` times, the
least CPU of each kept (the machine is shared):

- ``old``: ``--old-rev`` (default ``main``), its ``adapters/`` and ``embedline/`` taken with
  ``git archive``;
- ``lines``: this checkout read line by line (``csv_lines.Lines``, forced), the path for
  CR-only line ends, UTF-16 and other codecs;
- ``new``: this checkout as it runs (``csv_lines.Blocks`` where it applies).

Every variant must produce the same plan and rows (their SHA-256 over ``repr``s, the plan's
field by field, so a field added later changes nothing, is compared). Numbers and ratios
only, never a timed assertion; the JSON goes to ``--out`` (default
``benchmarks/results/planning-<UTC time>.json``). Usage::

    python benchmarks/bench_planning.py [--mb 300] [--chunk-size 5000] [--repeat 3]
        [--old-rev main] [--dir DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_CHILD = r"""
import hashlib, json, resource, sys
from adapters import csv_records
from adapters.csv_chunks import read_chunk
from adapters.csv_source import plan_csv

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

path, chunk_size, force_lines = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "lines"
if force_lines:
    csv_records.block_decodable = lambda codec, newline: False
def planned(plan):  # what a plan says, field by field: a field added later changes no digest
    fields = ("index", "key", "first_row", "line_start", "rows", "byte_start", "byte_stop",
              "bytes_sha256")
    return (plan.sha256, plan.bytes, plan.rows, plan.source,
            [tuple(getattr(c, f) for f in fields) for c in plan.chunks])
started = cpu()
plan = plan_csv(path, id_column="id", text_column="text", codec="auto", chunk_size=chunk_size,
                model="m", dimensions=None)
plan_s = cpu() - started
read_s, rows = 0.0, hashlib.sha256()
for spec in plan.chunks:
    started = cpu()
    chunk = read_chunk(plan.source, spec)
    read_s += cpu() - started
    rows.update(repr([(r, r.text, r.kept) for r in chunk]).encode())  # not timed
print(json.dumps({"plan_s": plan_s, "read_s": read_s, "bytes": plan.bytes,
                  "rows": plan.rows, "chunks": len(plan.chunks),
                  "plan_sha256": hashlib.sha256(repr(planned(plan)).encode()).hexdigest(),
                  "rows_sha256": rows.hexdigest()}))
"""


def write_export(source: Path, target: Path, min_bytes: int) -> tuple[int, int]:
    """Write passes over ``source``'s rows to ``target`` until it holds ``min_bytes``; each
    pass gives every row the id ``ID~N`` and appends ``\\n(variant N)`` to its text.
    Returns (rows, bytes)."""
    with source.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = list(reader)
    id_at, text_at = header.index("id"), header.index("text")
    written = 0
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        n = 0
        while out.tell() < min_bytes:
            for row in rows:
                row = list(row)
                row[id_at] = f"{row[id_at]}~{n}"
                row[text_at] = f"{row[text_at]}\n(variant {n})"
                writer.writerow(row)
            n += 1
            written += len(rows)
    return written, target.stat().st_size


def old_tree(rev: str, into: Path) -> Path:
    """``adapters/`` and ``embedline/`` of ``rev`` (``git archive``), unpacked into ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "adapters", "embedline"],
        capture_output=True,
        check=True,
    )
    tar_path = into / "old.tar"
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def measure(tree: Path, data: Path, chunk_size: int, mode: str) -> dict[str, Any]:
    """One planning pass and one read of every chunk in a fresh interpreter importing the
    code of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(data), str(chunk_size), mode],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{child.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(child.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="least size of the export, MB")
    parser.add_argument("--chunk-size", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-rev", default="main")
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO.parent,
        help="where the temporary directory goes (default: beside the checkout)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default benchmarks/results/planning-<UTC time>.json)",
    )
    args = parser.parse_args()
    from tests.support.real_data import ENGLISH_NAME, real_csv

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="embedline-bench-planning-") as tmp:
        data = Path(tmp) / "export.csv"
        rows, size = write_export(real_csv(ENGLISH_NAME), data, args.mb * 1_000_000)
        print(
            f"export: {rows:,} rows, {size / 1e6:,.0f} MB ({data}); chunks of "
            f"{args.chunk_size:,} rows; old = {args.old_rev}"
        )
        trees = {"old": old_tree(args.old_rev, Path(tmp)), "lines": REPO, "new": REPO}
        best: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeat):
            for variant, tree in trees.items():
                got = measure(tree, data, args.chunk_size, variant)
                kept = best.setdefault(variant, got)
                kept["plan_s"] = min(kept["plan_s"], got["plan_s"])
                kept["read_s"] = min(kept["read_s"], got["read_s"])
    digests = {(r["plan_sha256"], r["rows_sha256"]) for r in best.values()}
    gb = size / 1e9
    print(f"{'variant':<8} {'plan s':>8} {'plan s/GB':>10} {'read s':>8} {'read s/GB':>10}")
    for variant, r in best.items():
        print(
            f"{variant:<8} {r['plan_s']:8.2f} {r['plan_s'] / gb:10.2f} "
            f"{r['read_s']:8.2f} {r['read_s'] / gb:10.2f}"
        )
    old, new = best["old"], best["new"]
    print(
        f"old / new: planning {old['plan_s'] / new['plan_s']:.2f}x, chunk reads "
        f"{old['read_s'] / new['read_s']:.2f}x, both "
        f"{(old['plan_s'] + old['read_s']) / (new['plan_s'] + new['read_s']):.2f}x"
    )
    print(f"identical plans and rows across variants: {'yes' if len(digests) == 1 else 'NO'}")
    now = dt.datetime.now(dt.UTC)
    out = args.out or REPO / "benchmarks" / "results" / f"planning-{now:%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "when": now.isoformat(timespec="seconds"),
                "rows": rows,
                "bytes": size,
                "chunk_size": args.chunk_size,
                "old_rev": args.old_rev,
                "load_average": os.getloadavg(),
                "variants": best,
            },
            indent=2,
        )
    )
    print(f"results: {out}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
