#!/usr/bin/env python3
"""Inputs charged against distinct texts when requests fail and the run is retried.

The whole English file (or ``--data``), the fake OpenAI-compatible server failing
``--fail-rate`` (default 5 %) of embedding requests with a 503 (seeded, so two runs see the
same failures), ``--max-attempts 1``, ``--chunk-retries 0``: the first run fails some
chunks; then the same command is run again (a Retry from the Prefect UI does the same) until
the run completes or ``--reruns`` is used up, against the same failing server. The server
counts charges per text (``FakeEmbeddingServer.charged_texts``: the independent truth).

Prints, per pass and in total: inputs charged, distinct texts, texts charged more than
once, and the target: at most the distinct texts plus the inputs of requests in
flight at each failure (a 503 is not charged, so here the bound is the distinct texts).
Writes JSON to ``--out`` (default ``benchmarks/results/paid-<UTC time>.json``).

``--repo PATH`` runs another checkout's CLI (e.g. main, for the before figures)::

    python benchmarks/bench_paid.py [--data PATH] [--fail-rate 0.05] [--repo PATH]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.fake_openai import FakeEmbeddingServer  # noqa: E402
from tests.support.real_data import ENGLISH_NAME, real_csv  # noqa: E402


class FailSome:
    """A ``fail_when`` hook: a 503 for a seeded ``rate`` of the embedding requests."""

    def __init__(self, rate: float, seed: int) -> None:
        self.rate, self.rng, self.lock, self.failed = rate, random.Random(seed), threading.Lock(), 0

    def __call__(self, payload: Any) -> dict[str, Any] | None:
        with self.lock:
            if self.rng.random() >= self.rate:
                return None
            self.failed += 1
        return {"status": 503}


def text_rows(path: Path) -> Counter[str]:
    """Rows per distinct non-empty text (by ``sha256(text)``)."""
    with path.open(encoding="utf-8", newline="") as fh:
        return Counter(
            hashlib.sha256(r["text"].encode()).hexdigest()
            for r in csv.DictReader(fh)
            if r["text"].strip()
        )


def run_pass(repo: Path, data: Path, work: Path, server: FakeEmbeddingServer) -> dict[str, Any]:
    args = [
        sys.executable,
        "-m",
        "cli",
        "run",
        str(data),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        str(work / "out"),
        "--ledger",
        str(work / "ledger.sqlite3"),
        "--max-attempts",
        "1",
        "--chunk-retries",
        "0",
        "--allow-failed-rows",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "AWS_"))}
    env.update(
        PYTHONPATH=str(repo),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
    )
    before = server.charged_texts()
    started = time.monotonic()
    result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    charged = server.charged_texts() - before
    last = (result.stderr.strip().splitlines() or [""])[-1]
    return {
        "exit_code": result.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "inputs_charged": sum(charged.values()),
        "last_line": last[:200],
        "charged": charged,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--fail-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--reruns", type=int, default=4)
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    data = args.data or real_csv(ENGLISH_NAME)
    if not data.exists():
        sys.exit(f"bench_paid: no such file: {data}")
    rows_of = text_rows(data)
    distinct = set(rows_of)
    hook = FailSome(args.fail_rate, args.seed)
    passes = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-paid-") as tmp,
        FakeEmbeddingServer(dims=384) as server,
    ):
        server.fail_when(hook)
        for n in range(1 + args.reruns):
            one = run_pass(args.repo, data, Path(tmp), server)
            passes.append(one)
            print(
                f"pass {n}: exit {one['exit_code']}, {one['inputs_charged']:,} inputs "
                f"charged, {one['wall_s']} s",
                flush=True,
            )
            if one["exit_code"] == 0:
                break
        charged = server.charged_texts()
        paid_left = (
            sum(1 for _ in (Path(tmp) / "out" / "_embedline" / "paid").rglob("*.parquet"))
            if (Path(tmp) / "out" / "_embedline" / "paid").exists()
            else 0
        )
    total = sum(charged.values())
    twice = sum(1 for n in charged.values() if n > 1)
    multi = [
        {
            "text": h[:12],
            "rows": rows_of[h],
            "charged": n,
            "per_pass": [p["charged"][h] for p in passes],
        }
        for h, n in sorted(charged.items())
        if n > 1
    ]
    for one in passes:
        del one["charged"]
    report = {
        "data": str(data),
        "repo": str(args.repo),
        "fail_rate": args.fail_rate,
        "seed": args.seed,
        "requests_failed": hook.failed,
        "passes": passes,
        "completed": bool(passes and passes[-1]["exit_code"] == 0),
        "distinct_texts": len(distinct),
        "inputs_charged": total,
        "texts_charged_more_than_once": twice,
        "extra_inputs": total - len(distinct),
        "extra_pct": round(100.0 * (total - len(distinct)) / len(distinct), 2),
        "target_met": total <= len(distinct),
        "paid_objects_left": paid_left,
        "charged_more_than_once": multi[:50],
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    print(
        f"{total:,} inputs charged for {len(distinct):,} distinct texts: "
        f"{report['extra_inputs']:,} extra ({report['extra_pct']} %), "
        f"{twice:,} texts charged more than once; {hook.failed} requests failed; "
        f"target (<= distinct texts) {'met' if report['target_met'] else 'missed'}"
    )
    out = args.out or REPO / "benchmarks" / "results" / (
        "paid-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + ".json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
