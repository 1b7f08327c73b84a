#!/usr/bin/env python3
"""Throughput of a Dask cluster against threads at 1 s API latency, and one RPM budget.

Each case is one ``python -m cli run`` of ``--rows`` synthetic rows (``--chunk-size`` rows a
chunk, one request a chunk) against the fake OpenAI-compatible server in this process
(``tests.support.fake_openai``, every answer ``--delay-s`` late), a fresh output and ledger,
and one ``prefect server`` the bench starts for all cases:

- ``threads``: ``--concurrency 2C`` (C: ``--concurrency``), one process;
- ``dask-1``, ``dask-2``: ``--task-runner dask --dask-workers 1|2 --concurrency C`` (a local
  cluster: each worker process sends at most C requests at once, as one process does), so
  ``dask-2`` has the total concurrency of ``threads``;
- ``rpm-2``: ``dask-2`` with ``--rpm R`` against the fake enforcing R a minute
  (``tests.support.rate_window``, a bucket of one second's worth): 429s answered, and the
  share of the limit used after the first second.

rows/s: inputs the fake answered / (last answer's arrival - first's + ``--delay-s``), i.e.
the embedding phase seen from the server (start-up apart). CPU s: the command and its
reaped processes (the workers of the local cluster). Targets (reported, never asserted):
``dask-2`` >= 1.8x ``dask-1``; ``dask-2`` >= 1.0x ``threads``; ``rpm-2`` 0 refused and >= 90 %
of the limit used. The before figures are measured in the same run, case by case
alternated with the current code (the machine's drift lands on both sides): the code of
``--before-ref REF`` (``git archive``; default: the commit the newest committed
``results/dask-before-main-REF.json`` names) or of the checkout ``--before-repo PATH``. With
``--no-before`` (or no git history) that committed file is printed beside instead. JSON to
``--out`` (default ``results/dask-<UTC time>.json``)::

    python benchmarks/bench_dask.py [--rows 20000] [--chunk-size 100] [--concurrency 4]
        [--delay-s 1] [--rpm 300] [--repo PATH] [--before-ref REF | --before-repo PATH |
        --no-before] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cli import running_prefect_server  # noqa: E402

from tests.support.fake_openai import FakeEmbeddingServer  # noqa: E402
from tests.support.rate_window import RateWindow  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
TARGET_SCALING = 1.8  # dask-2 / dask-1 rows/s
TARGET_VS_THREADS = 1.0  # dask-2 / threads rows/s, equal total concurrency
TARGET_RPM_USED = 0.9  # share of --rpm used by rpm-2, with 0 refused


def write_input(path: Path, rows: int) -> None:
    """``rows`` rows of distinct three-word texts."""
    with path.open("w") as fh:
        fh.write("id,text\n")
        fh.writelines(f"r{i:06d},bench text {i}\n" for i in range(rows))


def cases(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each case's options beyond the common ones."""
    dask = ["--task-runner", "dask", "--concurrency", str(args.concurrency)]
    return {
        "threads": ["--concurrency", str(2 * args.concurrency)],
        "dask-1": [*dask, "--dask-workers", "1"],
        "dask-2": [*dask, "--dask-workers", "2"],
        "rpm-2": [*dask, "--dask-workers", "2", "--rpm", str(args.rpm)],
    }


def run_case(
    name: str, extra: list[str], repo: Path, args: argparse.Namespace, api_url: str, tmp: Path
) -> dict[str, Any]:
    """One CLI run of case ``name`` with ``repo``'s code, against a fresh fake server."""
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))
    write_input(work / "in.csv", args.rows)
    window = RateWindow(rpm=args.rpm) if name.startswith("rpm") else None
    delay = {"delay_s": args.delay_s}
    with FakeEmbeddingServer(dims=args.dims) as fake:
        fake.fail_when(lambda payload: (window(payload) if window else None) or delay)
        argv = [
            sys.executable, "-m", "cli", "run", "in.csv", "--embedder", "openai",
            "--base-url", fake.base_url, "--dimensions", str(args.dims), "--output", "out",
            "--ledger", "ledger.sqlite3", "--chunk-size", str(args.chunk_size), *extra,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_"))}
        env.update(
            PYTHONPATH=str(repo),
            PREFECT_API_URL=api_url,
            PREFECT_HOME=str(tmp / "prefect-home"),
        )
        started = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.monotonic() - started
        answered = [e for e in fake.log if e["status"] == 200]
    result: dict[str, Any] = {
        "case": name,
        "repo": str(repo),
        "argv": extra,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "requests": len(answered),
        "rows_per_s": None,
        "last_line": (proc.stderr.strip().splitlines() or [""])[-1][:300],
    }
    if answered:
        first = min(e["at"] for e in answered)
        span = max(e["at"] for e in answered) - first + args.delay_s
        result["rows_per_s"] = round(sum(e["n_inputs"] for e in answered) / span, 1)
        # requests waiting on the fake at once, on average: the concurrency the run reached
        result["mean_in_flight"] = round(len(answered) * args.delay_s / span, 2)
        per_s = [0] * (int(span) + 1)
        for e in answered:
            per_s[int(e["at"] - first)] += 1
        result["requests_per_s"] = per_s
    if window is not None:
        result["refused_429"] = window.refused
        result["rpm_used"] = round(window.rate_per_minute(skip_s=1.0), 1)
    return result


def ratios(runs: dict[str, dict[str, Any]], rpm: int) -> dict[str, Any]:
    """The figures the targets read, from one code's runs by case."""

    def rate(case: str) -> float | None:
        run = runs.get(case)
        return run["rows_per_s"] if run and run["exit_code"] == 0 else None

    def ratio(a: str, b: str) -> float | None:
        x, y = rate(a), rate(b)
        # four places: a target is judged on the ratio, not on a rounding of it (0.998 of
        # threads is below 1.0)
        return round(x / y, 4) if x and y else None

    rpm_run = runs.get("rpm-2") or {}
    return {
        "dask2_over_dask1": ratio("dask-2", "dask-1"),
        "dask2_over_threads": ratio("dask-2", "threads"),
        "refused_429": rpm_run.get("refused_429"),
        "rpm_used_share": round(rpm_run["rpm_used"] / rpm, 3) if rpm_run.get("rpm_used") else None,
    }


def targets(figures: dict[str, Any]) -> dict[str, Any]:
    def met(value: float | None, floor: float) -> bool | None:
        return None if value is None else value >= floor

    used = figures["rpm_used_share"]
    return {
        f"dask-2 >= {TARGET_SCALING}x dask-1": {
            "value": figures["dask2_over_dask1"],
            "met": met(figures["dask2_over_dask1"], TARGET_SCALING),
        },
        f"dask-2 >= {TARGET_VS_THREADS}x threads (equal total concurrency)": {
            "value": figures["dask2_over_threads"],
            "met": met(figures["dask2_over_threads"], TARGET_VS_THREADS),
        },
        f"--rpm on 2 workers: 0 429s, >= {TARGET_RPM_USED:.0%} of the limit used": {
            "value": {"refused_429": figures["refused_429"], "used": used},
            "met": None if used is None else figures["refused_429"] == 0 and used >= 0.9,
        },
    }


_BASELINE = "dask-before-main-"


def newest_before() -> dict[str, Any] | None:
    """The newest committed baseline's figures (``results/dask-before-main-REF.json``)."""
    files = sorted(RESULTS.glob(f"{_BASELINE}*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(files[-1].read_text()) if files else None


def baseline_ref() -> str | None:
    """The commit the newest committed baseline was measured on (its file name's REF)."""
    files = sorted(RESULTS.glob(f"{_BASELINE}*.json"), key=lambda p: p.stat().st_mtime)
    return files[-1].stem[len(_BASELINE) :] if files else None


def checkout(ref: str, dest: Path) -> Path | None:
    """``ref``'s tree extracted into ``dest`` (``git archive``), or None without that
    commit (a shallow clone)."""
    dest.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref], capture_output=True, check=False
    )
    if archive.returncode != 0:
        print(f"bench: no commit {ref} here: before figures from the committed file", flush=True)
        return None
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def print_table(after: dict[str, Any], before: dict[str, Any] | None) -> None:
    print(
        f"{'case':<10} {'rows/s':>9} {'before':>9} {'in flight':>9} {'before':>7} "
        f"{'cpu s':>7} {'before':>7} {'429s':>5}"
    )
    for case, run in after["runs"].items():
        old = (before or {}).get("runs", {}).get(case, {})

        def fig(run: dict[str, Any], key: str) -> str:
            value = run.get(key)
            return (
                "-" if value is None else f"{value:,.0f}" if key == "rows_per_s" else f"{value:.1f}"
            )

        refused = run.get("refused_429")
        old_refused = old.get("refused_429")
        print(
            f"{case:<10} {fig(run, 'rows_per_s'):>9} {fig(old, 'rows_per_s'):>9} "
            f"{fig(run, 'mean_in_flight'):>9} {fig(old, 'mean_in_flight'):>7} "
            f"{fig(run, 'cpu_s'):>7} {fig(old, 'cpu_s'):>7} "
            f"{'-' if refused is None else refused:>5}"
            f"{'' if old_refused is None else f' (before {old_refused})'}"
            f"{'' if run['exit_code'] == 0 else '  exit ' + str(run['exit_code'])}"
        )
    for name, target in after["targets"].items():
        verdict = {True: "MET", False: "MISSED", None: "-"}[target["met"]]
        print(f"{verdict:<6} {name}: {target['value']}")
    if before is not None:
        print(f"before ({before['repo']}): {before['figures']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--chunk-size", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delay-s", type=float, default=1.0)
    parser.add_argument("--rpm", type=int, default=300)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--cases", default="threads,dask-1,dask-2,rpm-2")
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--before-repo", type=Path, default=None)
    parser.add_argument("--before-ref", default=None)
    parser.add_argument("--no-before", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    chosen = {k: v for k, v in cases(args).items() if k in args.cases.split(",")}
    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp_name:
        tmp = Path(tmp_name)
        before_repo = args.before_repo
        ref = None if args.no_before or before_repo else args.before_ref or baseline_ref()
        if ref is not None:
            before_repo = checkout(ref, tmp / "before")
        codes = {"after": args.repo, **({"before": before_repo} if before_repo else {})}
        runs: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in codes}
        with running_prefect_server(tmp / "prefect-home") as (_, api_url):
            for case, extra in chosen.items():
                for label, repo in codes.items():  # alternated: drift lands on both sides
                    run = run_case(case, extra, repo, args, api_url, tmp)
                    runs[label][case] = run
                    print(
                        f"{label} {case}: exit {run['exit_code']}, {run['rows_per_s']} rows/s, "
                        f"{run['cpu_s']} CPU s, {run['wall_s']} s wall",
                        file=sys.stderr,
                        flush=True,
                    )
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    params = {k: getattr(args, k) for k in ("rows", "chunk_size", "concurrency", "delay_s", "rpm")}
    reports: dict[str, dict[str, Any]] = {
        label: {
            "repo": str(repo) if label == "after" or ref is None else f"{ref} (git archive)",
            "params": params,
            "runs": runs[label],
            "figures": ratios(runs[label], args.rpm),
            "at": stamp,
        }
        for label, repo in codes.items()
    }
    for report in reports.values():
        report["targets"] = targets(report["figures"])
    before = reports.get("before") or newest_before()
    reports["after"]["before"] = before
    print_table(reports["after"], before)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"dask-{stamp}.json"
    out.write_text(json.dumps(reports["after"], indent=2) + "\n")
    print(f"written: {out}")
    if "before" in reports:
        before_out = out.with_name(f"dask-before-{stamp}.json")
        before_out.write_text(json.dumps(reports["before"], indent=2) + "\n")
        print(f"before written: {before_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
