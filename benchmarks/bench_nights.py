#!/usr/bin/env python3
"""Storage over many nights: a first run and ``--nights`` nights, each editing ``--fraction``
of the rows at positions drawn anew each night (so the edits fall in different objects every
night), then ``embedline gc --keep-runs K``; what each night writes against the first run,
and what the output keeps against one full copy.

The exports are ``synthetic.py``'s base rows (``--rows``, default 1,000,000); night ``n``'s
export is night ``n - 1``'s with ``--fraction`` (default 0.5 %) of its rows edited: the rows
drawn for night ``n`` by a hash of the row number salted with ``n``, each edited row's text
ending in `` [row k, night n]`` (a row drawn again later takes the later night's text). Each
command is ``bench_cli``'s ``python -m cli run … --embedder openai --dimensions 64
--chunk-size 5000`` against a 64-dim fake server, one local output and one ledger, its own
temporary Prefect server.

Reported per night: the bytes the output grew by (``bench_scale.written``: files new or
changed under ``chunks/``, ``changes/``, ``manifests/``) and their ratio to the first run's,
the inputs charged against the rows that night edited, CPU s. After ``gc --keep-runs K
--grace 0s`` (``--keep-runs``, default 14): the bytes under ``chunks/``, ``changes/`` and
``manifests/`` against the first run's written bytes (one full copy). Targets (reported, never
asserted): a night writes at most 2 % of the first run's bytes; the output keeps at most 1.1×
one full copy. JSON to ``--out`` (default ``results/nights-<ROWS>-<UTC time>.json``)::

    python benchmarks/bench_nights.py [--rows 1000000] [--nights 15] [--fraction 0.005]
        [--keep-runs 14] [--repo PATH] [--workdir DIR] [--keep] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import synthetic  # noqa: E402
from bench_reuse import cli_bench, git_head, make_workdir, measure  # noqa: E402
from bench_scale import run_gc, snapshot, tree_bytes, written  # noqa: E402

TARGET_NIGHT = 0.02  # a night's bytes written / the first run's
TARGET_KEPT = 1.1  # bytes kept after gc / one full copy
_COUNTED = ("chunks", "changes", "manifests")


def _mixed(k: np.ndarray, salt: int) -> np.ndarray:
    """``synthetic._mix`` over an array of row numbers (``uint64``, wrapping as it does)."""
    with np.errstate(over="ignore"):
        z = k * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def last_edits(rows: int, night: int, fraction: float) -> np.ndarray:
    """For each row, the last night ``1..night`` that edited it (0: never)."""
    k = np.arange(rows, dtype=np.uint64)
    last = np.zeros(rows, dtype=np.int32)
    for n in range(1, night + 1):
        drawn = _mixed(k, 0x4E1 + n) % np.uint64(1_000_000) < np.uint64(round(fraction * 1e6))
        last[drawn] = n
    return last


def write_night(path: Path, rows: int, night: int, fraction: float) -> int:
    """Night ``night``'s export (0: the base); returns the rows that night edited."""
    last = last_edits(rows, night, fraction)
    texts = synthetic.debian_texts()
    with path.open("w", encoding="utf-8", newline="", buffering=1 << 20) as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(("id", "text"))
        for k, n in enumerate(last.tolist()):
            tag = f", night {n}" if n else ""
            out.writerow((synthetic.row_id(k), f"{texts[k % len(texts)]} [row {k}{tag}]"))
    return int((last == night).sum()) if night else rows


def counted_bytes(output: Path) -> int:
    tree = tree_bytes(output)
    return sum(tree.get(name, {}).get("bytes", 0) for name in _COUNTED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--nights", type=int, default=15, help="nights after the first run")
    parser.add_argument("--fraction", type=float, default=0.005, help="rows edited a night")
    parser.add_argument("--keep-runs", type=int, default=14, help="gc --keep-runs")
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout measured")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.quiet_wait = 0
    started_at = dt.datetime.now(dt.UTC)
    out = args.out or REPO / "benchmarks" / "results" / (
        f"nights-{args.rows}-{started_at:%Y%m%dT%H%M%SZ}.json"
    )
    tmp = make_workdir(args.workdir, args.rows * 1_500, "embedline-bench-nights-")
    bench = cli_bench(args, tmp, args.repo.resolve())
    output, ledger = tmp / "out", tmp / "ledger.sqlite3"
    nights: list[dict[str, Any]] = []
    try:
        for night in range(args.nights + 1):
            data = tmp / f"night-{night}.csv"
            edited = write_night(data, args.rows, night, args.fraction)
            before = snapshot(output) if output.exists() else {}
            name = "first" if night == 0 else f"night-{night}"
            run = measure(bench, name, "nights", args.rows, data, output, ledger)
            grew = written(before, snapshot(output))["total"]
            nights.append(
                {
                    "night": night,
                    "exit_code": run["exit_code"],
                    "written_bytes": grew["bytes"],
                    "objects": grew["files"],
                    "edited": edited,
                    "inputs_charged": run["inputs_charged"],
                    "cpu_s": run["cpu_s"],
                    "wall_s": run["wall_s"],
                }
            )
            data.unlink()
            first = nights[0]["written_bytes"]
            print(
                f"bench: {name}: wrote {grew['bytes']:,} bytes ({grew['bytes'] / first:.4f}x "
                f"the first) in {grew['files']} objects; charged {run['inputs_charged']} for "
                f"{edited} edited; CPU {run['cpu_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        before_gc = counted_bytes(output)
        gc = run_gc(bench, output, ledger, ["--keep-runs", str(args.keep_runs), "--grace", "0s"])
        kept = counted_bytes(output)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    first = nights[0]["written_bytes"]
    worst = max(n["written_bytes"] for n in nights[1:]) / first if len(nights) > 1 else None
    summary = {
        "worst_night_over_first": worst,
        "kept_after_gc_over_one_copy": kept / first,
        "bytes_before_gc": before_gc,
        "bytes_after_gc": kept,
        "charged_equals_edited": all(
            n["inputs_charged"] == n["edited"] for n in nights[1:] if n["inputs_charged"]
        ),
        "every_exit_0": all(n["exit_code"] == 0 for n in nights) and gc["exit_code"] == 0,
        "targets": {"night": TARGET_NIGHT, "kept": TARGET_KEPT},
    }
    print(
        f"\nworst night wrote {worst:.4f}x the first run's bytes (target <= {TARGET_NIGHT}); "
        f"after gc --keep-runs {args.keep_runs}: {kept:,} bytes, {kept / first:.3f}x one full "
        f"copy (target <= {TARGET_KEPT}); charged = edited every night: "
        f"{summary['charged_equals_edited']}"
    )
    results = {
        "benchmark": "bench_nights",
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "repo": git_head(args.repo.resolve()),
        "settings": vars(args) | {"repo": str(args.repo), "workdir": str(args.workdir)},
        "nights": nights,
        "gc": {"exit_code": gc["exit_code"], "wall_s": gc["wall_s"]},
        "summary": summary,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    sys.exit(code)
