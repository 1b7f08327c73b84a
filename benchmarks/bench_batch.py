#!/usr/bin/env python3
"""``embedline run --batch-api`` on the whole English file against the fake Batch API.

Submit, wait, collect, publish: the fake (``tests/support/fake_batch.py``, 384 dimensions,
batches done 0.1 s after their create) counts the inputs it charged in batches and the
synchronous requests it got. The run is right when inputs charged = distinct non-empty
texts of the file and synchronous requests = 0; its vectors are checked against the fake's
deterministic ones. A rerun of the same command must create no batch. Numbers are reported,
not asserted (``ok`` says whether the counts are right).

Usage::

    python benchmarks/bench_batch.py [--data PATH] [--out FILE.json] [--poll-interval 1]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # tests.support: not part of the installed package


def _distinct_texts(path: Path) -> tuple[int, int]:
    """(records, distinct non-empty texts) of the CSV's ``text`` column."""
    with path.open(newline="", encoding="utf-8-sig") as fh:
        texts = [row["text"] for row in csv.DictReader(fh)]
    return len(texts), len({t for t in texts if t.strip()})


def _run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EMBEDLINE_API_KEY": "sk-bench"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return result, time.monotonic() - started


def main() -> int:
    from tests.support.fake_batch import FakeBatchServer
    from tests.support.fake_openai import expected_matrix
    from tests.support.output import read_local_output
    from tests.support.real_data import ENGLISH_NAME, real_csv

    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()
    data = options.data or real_csv(ENGLISH_NAME)
    records, distinct = _distinct_texts(data)
    work = Path(tempfile.mkdtemp(prefix="embedline-bench-batch-"))
    with FakeBatchServer(dims=384, complete_after_s=0.1) as server:
        args = [
            "run",
            str(data),
            "--output",
            str(work / "out"),
            "--ledger",
            str(work / "l.sqlite3"),
            "--embedder",
            "openai",
            "--base-url",
            server.base_url,
            "--batch-api",
            "--batch-poll-interval",
            str(options.poll_interval),
            "--price-per-million-tokens",
            "0.02",
        ]
        first, first_s = _run(args, work)
        after_first = server.batch_counters()
        rerun, rerun_s = _run(args, work)
        after_rerun = server.batch_counters()
    exact = None
    if first.returncode == 0:
        _, vectors = read_local_output(work / "out")
        with data.open(newline="", encoding="utf-8-sig") as fh:
            rows = [(r["id"], r["text"]) for r in csv.DictReader(fh) if r["text"].strip()]
        want = expected_matrix([t for _, t in rows], 384)
        got = [vectors[i] for i, _ in rows]
        exact = bool(all(abs(a - b).max() < 1e-6 for a, b in zip(got, want, strict=True)))
    result: dict[str, Any] = {
        "benchmark": "bench_batch",
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "data": data.name,
        "records": records,
        "distinct_texts": distinct,
        "exit_code": first.returncode,
        "wall_s": round(first_s, 2),
        "batches_created": after_first["creates"],
        "batch_inputs_charged": after_first["batch_inputs"],
        "synchronous_requests": after_first["requests"],
        "vectors_exact": exact,
        "rerun_exit_code": rerun.returncode,
        "rerun_wall_s": round(rerun_s, 2),
        "rerun_batches_created": after_rerun["creates"] - after_first["creates"],
        "summary_stdout": first.stdout.strip().splitlines()[-12:],
    }
    result["ok"] = (
        first.returncode == 0
        and exact is True
        and result["batch_inputs_charged"] == distinct
        and result["synchronous_requests"] == 0
        and result["rerun_batches_created"] == 0
    )
    if first.returncode:
        result["stderr_tail"] = first.stderr.strip().splitlines()[-5:]
    out = options.out or REPO / "benchmarks" / "results" / (
        f"batch-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key in (
        "records",
        "distinct_texts",
        "batches_created",
        "batch_inputs_charged",
        "synchronous_requests",
        "vectors_exact",
        "wall_s",
        "rerun_batches_created",
        "rerun_wall_s",
        "ok",
    ):
        print(f"{key:24} {result[key]}")
    print(f"written {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
