#!/usr/bin/env python3
"""The scale run: one synthetic export of N rows through a first run and three nights on one
output, with what each night costs: bytes and objects written, bytes kept, Prefect task runs,
CPU (embedline and the Prefect server apart), wall time, peak RSS.

``make bench-scale ROWS=10000000`` (not in ``make bench``, not in CI). On the synthetic exports
of ``benchmarks/synthetic.py`` (about 320 bytes a row, so 10M rows are 3.2 GB a file), each
command measured by ``bench_cli.run_cli`` against a fresh fake OpenAI server, ``embedline run
--embedder openai --dimensions 64 --chunk-size 5000`` (``--dims``: another dimension for both),
one output and one ledger for every step, and one ``prefect server start`` the bench starts for
the whole run (its own ``PREFECT_HOME``; ``PREFECT_API_URL`` set for every command, as a
deployment runs), so its task runs can be counted and its CPU measured apart:

1. warm-up (1,000 rows, a throwaway output);
2. ``first``: the base export;
3. ``reused-shuffled``: the ``shuffled`` export (every row reused, none changed);
4. ``changed-0.001``: the base with 0.1 % of its texts edited at positions chosen by a hash
   of the row (``--fractions``; scattered through the file);
5. ``changed-0.01``: the base with 1 % of its texts edited, with another tag, so every one of
   them is a new text against the night before (the 0.1 % rows are among them);
6. ``gc``: ``embedline gc OUTPUT --keep-runs 1 --grace 0s --ledger LEDGER`` (``--gc-args``).

After every night but the first, ``--sample`` vectors (plus up to 200 edited rows) are read
back and checked against the fake server's.

Reported per night (``nights`` in the JSON): ``written``, the growth of the output during the
night by top-level folder (``chunks/``, ``changes/``, ``manifests/``: bytes of files new or
changed, and the new files: the objects written); ``kept_bytes``, the bytes the night's run
needs (the objects its manifest lists, its change set and the manifest: what ``gc --keep-runs
1`` keeps after that night; the real gc at the end checks it: ``after_gc``); the manifest's
entries and ``drop_ids``; ``task_runs`` and ``flow_runs``, what the server holds after the
night minus before (counted through its REST API once the count is steady: task-run states
reach the server as events); ``cpu_s``, the CLI and its reaped children; the server's CPU
during the night and until its counts settle (``prefect_server_cpu_s``); wall s, peak RSS of
the CLI, inputs charged (and the ideal: the texts that night edited), rows reused, other
processes' CPU. ``ratios``: each night against the first run. Also as before: the bytes of
the latest manifest, its change set, the ledger and the output by folder (again after gc),
and planning seconds per GB from a probe that runs the measured checkout's ``plan_csv`` alone
in its own process on the base export (and from a ``planned … in S s`` log line when the CLI
prints one).

Temp files go to ``--workdir`` (default: the system temp dir, or beside the repo when that
disk is short): one export at a time is on disk (each is deleted after its run), plus the
output and the ledger. JSON to ``benchmarks/results/scale-<ROWS>[-d<DIMS>]-<UTC time>.json``::

    python benchmarks/bench_scale.py --rows 10000000 [--dims 64] [--fractions 0.001 0.01]
        [--repo PATH]
        [--workdir DIR] [--sample 2000] [--quiet-wait 60] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import synthetic  # noqa: E402
from bench_cli import (  # noqa: E402
    _fmt,
    _machine,
    _machine_busy_s,
    _self_cpu_s,
    run_cli,
    running_prefect_server,
    wait_quiet,
)
from bench_reuse import (  # noqa: E402
    CHUNK_SIZE,
    DIMS,
    _row_count,
    _tree_cpu_s,
    check_vectors,
    cli_bench,
    describe,
    export,
    git_head,
    make_workdir,
    measure,
    warm_up,
)

# The probe: the measured checkout's own argument parsing and plan_csv, in a fresh process.
_PLAN_PROBE = r"""
import json, resource, sys, time
out = {"error": None}
try:
    from cli.main import _parser
    try:
        from cli.run import settings_from
    except ImportError:  # a checkout from before the rename
        from cli.run import _settings_from as settings_from
    from adapters.csv_source import plan_csv
    args = _parser().parse_args(["run", *sys.argv[1:]])
    settings = settings_from(args)
    wall, cpu = time.perf_counter(), time.process_time()
    plan = plan_csv(settings.input, **settings.plan_arguments)
    out.update(wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu,
               rows=plan.rows, bytes=plan.bytes, chunks=len(plan.chunks))
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:500]
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def plan_probe(bench: Any, data: Path, output: Path, ledger: Path) -> dict[str, Any]:
    """Time ``plan_csv`` of the measured checkout on ``data`` with the runs' settings."""
    argv = [
        bench.args.python,
        "-c",
        _PLAN_PROBE,
        str(data),
        "--embedder",
        "openai",
        *bench.args.cli_arg,
        "--output",
        str(output),
        "--ledger",
        str(ledger),
    ]
    if bench.args.quiet_wait > 0:
        wait_quiet(bench.args.quiet_wait)
    print(f"bench: planning probe on {data.name}", file=sys.stderr, flush=True)
    busy0, self0 = _machine_busy_s(), _self_cpu_s()
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=bench.tmp, env=bench.env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    result: dict[str, Any] = (
        json.loads(lines[-1])
        if lines
        else {"error": f"exit {done.returncode}: {done.stderr[-500:]}"}
    )
    result["process_wall_s"] = wall
    result["other_cores"] = (
        max(0.0, _machine_busy_s() - busy0 - (result.get("cpu_s") or 0) - (_self_cpu_s() - self0))
        / wall
    )
    if result.get("wall_s") and result.get("bytes"):
        result["s_per_gb"] = result["wall_s"] / (result["bytes"] / 1e9)
        result["cpu_s_per_gb"] = result["cpu_s"] / (result["bytes"] / 1e9)
    return result


def file_bytes(path: Path) -> int | None:
    return path.stat().st_size if path.exists() else None


def ledger_bytes(ledger: Path) -> dict[str, int | None]:
    parts = {
        name: file_bytes(ledger.with_name(ledger.name + suffix))
        for name, suffix in (("db", ""), ("wal", "-wal"), ("shm", "-shm"))
    }
    return {**parts, "total": sum(v for v in parts.values() if v)}


def tree_bytes(root: Path) -> dict[str, Any]:
    """Bytes and files of the output under each top-level folder."""
    out: dict[str, Any] = {}
    if not root.exists():
        return out
    for top in sorted(root.iterdir()):
        files = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        out[top.name] = {"bytes": sum(p.stat().st_size for p in files), "files": len(files)}
    out["total"] = {
        "bytes": sum(v["bytes"] for v in out.values()),
        "files": sum(v["files"] for v in out.values()),
    }
    return out


def run_sizes(output: Path, run_key: str | None, ledger: Path) -> dict[str, Any]:
    """The latest run's manifest and change set, the ledger, the output by folder."""
    manifest_path = output / "manifests" / f"{run_key}.json" if run_key else None
    manifest: dict[str, Any] = {}
    if manifest_path is not None and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
    changes = manifest.get("changes") if isinstance(manifest.get("changes"), dict) else {}
    change_key = (changes or {}).get("object") or (
        f"changes/{run_key}.parquet" if run_key else None
    )
    return {
        "run_key": run_key,
        "manifest_bytes": file_bytes(manifest_path) if manifest_path else None,
        "change_set_object": change_key,
        "change_set_bytes": file_bytes(output / change_key) if change_key else None,
        "ledger_bytes": ledger_bytes(ledger),
        "output": tree_bytes(output),
    }


def run_gc(bench: Any, output: Path, ledger: Path, gc_args: Sequence[str]) -> dict[str, Any]:
    """``embedline gc OUTPUT … --ledger LEDGER``, measured like the runs (no fake server)."""
    argv = [bench.args.python, "-m", "cli", "gc", str(output), *gc_args, "--ledger", str(ledger)]
    if bench.args.quiet_wait > 0:
        wait_quiet(bench.args.quiet_wait)
    print(f"bench: gc: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    busy0, self0 = _machine_busy_s(), _self_cpu_s()
    log = bench.tmp / "gc.stderr.log"
    result = run_cli(
        "gc",
        argv,
        env=bench.env,
        cwd=bench.tmp,
        dataset="output",
        rows_input=0,
        log_path=log,
        prefect_home_fresh=False,
    )
    result.other_cpu_s = max(
        0.0, _machine_busy_s() - busy0 - result.cpu_s - (_self_cpu_s() - self0)
    )
    print(
        f"bench: gc: exit {result.exit_code}, wall {result.wall_s:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    out = describe(result, log)
    out["stdout"] = result.stdout[-4000:]
    return out


# -- what a night writes and keeps ---------------------------------------------------------

_COUNTED = ("chunks", "changes", "manifests")


def snapshot(root: Path) -> dict[str, int]:
    """Every file of the output: its path relative to ``root`` -> its size."""
    out: dict[str, int] = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            out[path.relative_to(root).as_posix()] = path.stat().st_size
    return out


def written(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """What a night added to the output, by top-level folder: the bytes of the files new or
    changed in size, the new files (objects written), the files gone."""
    out: dict[str, Any] = {}
    for path, size in after.items():
        if before.get(path) == size:
            continue
        top = path.split("/", 1)[0] if "/" in path else "(top)"
        part = out.setdefault(top, {"bytes": 0, "files": 0})
        part["bytes"] += size
        part["files"] += path not in before
    counted = [v for k, v in out.items() if k in _COUNTED]
    out["total"] = {
        "bytes": sum(v["bytes"] for v in counted),
        "files": sum(v["files"] for v in counted),
        "removed": len(before.keys() - after.keys()),
    }
    return out


def run_needs(output: Path, run_key: str | None) -> dict[str, Any]:
    """The objects the run's manifest lists (its own and those it inherits), its change set
    and the manifest itself: the bytes ``gc --keep-runs 1`` keeps for it."""
    path = output / "manifests" / f"{run_key}.json"
    if not run_key or not path.exists():
        return {"kept_bytes": None}
    manifest = json.loads(path.read_text())
    entries = manifest.get("chunks") or []
    objects = {e["object"] for e in entries if isinstance(e, dict) and e.get("object")}
    changes = manifest.get("changes") if isinstance(manifest.get("changes"), dict) else {}
    if (changes or {}).get("object"):
        objects.add(changes["object"])
    sizes = [file_bytes(output / key) for key in objects]
    with_drops = [e for e in entries if isinstance(e, dict) and e.get("drop_ids")]
    return {
        "kept_bytes": sum(v or 0 for v in sizes) + path.stat().st_size,
        "kept_objects": len(objects) + 1,
        "missing_objects": sum(v is None for v in sizes),
        "manifest_entries": len(entries),
        "entries_with_drop_ids": len(with_drops),
        "drop_ids": sum(len(e["drop_ids"]) for e in with_drops),
        "base_run_key": (changes or {}).get("base_run_key"),
    }


# -- the Prefect server's counts -----------------------------------------------------------


def api_count(url: str, what: str) -> int | None:
    """``POST {url}/{what}/count`` (``task_runs``, ``flow_runs``) with no filter."""
    request = urllib.request.Request(
        f"{url}/{what}/count",
        data=b"{}",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(json.loads(response.read()))
    except (OSError, ValueError) as exc:
        print(f"bench: {url}/{what}/count: {exc}", file=sys.stderr, flush=True)
        return None


def counts(url: str) -> dict[str, int | None]:
    return {what: api_count(url, what) for what in ("task_runs", "flow_runs")}


def settle(url: str, server_pid: int, *, steady_s: float = 3.0, max_s: float = 120.0) -> float:
    """Wait until the server's task-run count has not moved for ``steady_s`` and it used
    under 0.1 CPU s in the last second (task-run states arrive as events the server writes
    after the CLI has gone); return the seconds waited (at most ``max_s``)."""
    started = time.monotonic()
    last, since = api_count(url, "task_runs"), time.monotonic()
    while time.monotonic() - started < max_s:
        cpu0 = _tree_cpu_s(server_pid)
        time.sleep(1.0)
        busy = _tree_cpu_s(server_pid) - cpu0
        now = api_count(url, "task_runs")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= steady_s and busy < 0.1:
            break
    return time.monotonic() - started


def night(
    bench: Any,
    name: str,
    variant: str,
    data: Path,
    rows: int,
    output: Path,
    ledger: Path,
    server: Any,
    url: str,
) -> dict[str, Any]:
    """One measured ``run`` and what it cost beyond bench_reuse's figures: the output's
    growth, the bytes the run needs, the server's task and flow runs and CPU until they
    settle."""
    before = snapshot(output) if output.exists() else {}
    count0, cpu0 = counts(url), _tree_cpu_s(server.pid)
    run = measure(bench, name, variant, rows, data, output, ledger, server_pid=server.pid)
    run["prefect_server_cpu_run_s"] = run.get("prefect_server_cpu_s")
    run["prefect_settle_s"] = settle(url, server.pid)
    run["prefect_server_cpu_s"] = _tree_cpu_s(server.pid) - cpu0
    run["cpu_with_server_s"] = (run["cpu_s"] or 0.0) + run["prefect_server_cpu_s"]
    count1 = counts(url)
    for what in ("task_runs", "flow_runs"):
        a, b = count0[what], count1[what]
        run[what] = None if a is None or b is None else b - a
    run["written"] = written(before, snapshot(output))
    run.update(run_needs(output, run["run_key"]))
    print(
        f"bench: {name}: wrote {run['written']['total']['bytes'] / 1e6:,.1f} MB in "
        f"{run['written']['total']['files']:,} files; {run['task_runs']} task runs; "
        f"server CPU {run['prefect_server_cpu_s']:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return run


def edited_rows(rows: int, fraction: float, limit: int = 200) -> list[int]:
    """The first ``limit`` base rows the ``changed`` export edits at ``fraction``."""
    found: list[int] = []
    for k in range(rows):
        if synthetic.is_changed(k, fraction):
            found.append(k)
            if len(found) == limit:
                break
    return found


def ratios(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each night against the first run: bytes written, objects written, task runs, CPU
    (the CLI's; with the server's), wall time."""
    first = next((r for r in runs if r["name"] == "first"), None)
    if first is None:
        return {}

    def ratio(a: Any, b: Any) -> float | None:
        return a / b if a is not None and b else None

    out = {}
    for r in runs:
        if r["name"] in ("first", "gc") or "written" not in r:
            continue
        out[r["name"]] = {
            "bytes_written": ratio(
                r["written"]["total"]["bytes"], first["written"]["total"]["bytes"]
            ),
            "objects_written": ratio(
                r["written"]["total"]["files"], first["written"]["total"]["files"]
            ),
            "kept_bytes": ratio(r.get("kept_bytes"), first.get("kept_bytes")),
            "task_runs": ratio(r.get("task_runs"), first.get("task_runs")),
            "cpu": ratio(r["cpu_s"], first["cpu_s"]),
            "cpu_with_server": ratio(r["cpu_with_server_s"], first["cpu_with_server_s"]),
            "wall": ratio(r["wall_s"], first["wall_s"]),
        }
    return out


def _rates(run: dict[str, Any]) -> None:
    run["rows_per_s"] = run["rows"] / run["wall_s"] if run["rows"] and run["wall_s"] else None
    flow = run.get("flow_wall_s")
    run["flow_rows_per_s"] = run["rows"] / flow if run["rows"] and flow else None


def print_report(
    runs: list[dict[str, Any]],
    sizes: dict[str, Any],
    plan: dict[str, Any] | None,
    checks: dict[str, Any],
    rows: int,
) -> None:
    head = (
        "step",
        "rows",
        "exit",
        "wall s",
        "rows/s",
        "flow rows/s",
        "CPU s",
        "RSS cli MB",
        "charged",
        "reused",
        "other cores",
    )
    lines = [head]
    for r in runs:
        lines.append(
            (
                r["name"],
                f"{r['rows']:,}",
                str(r["exit_code"]),
                _fmt(r["wall_s"]),
                _fmt(r.get("rows_per_s"), ",.0f"),
                _fmt(r.get("flow_rows_per_s"), ",.0f"),
                _fmt(r["cpu_s"]),
                _fmt(r["peak_rss_cli_mb"], ".0f"),
                "-" if r["inputs_charged"] is None else f"{r['inputs_charged']:,}",
                "-" if r["rows_reused"] is None else f"{r['rows_reused']:,}",
                _fmt(r["other_cores"], ".2f"),
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    print(f"\nscale run, {rows:,} rows")
    for row in lines:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )

    def mb(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value / 1e6:,.1f} MB" if value >= 1e6 else f"{value / 1e3:,.1f} KB"

    last = sizes.get("after_last_night", {})
    if last:
        print(
            f"\nafter the last night: manifest {mb(last['manifest_bytes'])}, change set "
            f"{mb(last['change_set_bytes'])}, ledger {mb(last['ledger_bytes']['total'])}"
        )
        for when in ("after_last_night", "after_gc"):
            tree = sizes.get(when, {}).get("output", {})
            if tree:
                print(
                    f"  output {when.replace('_', ' ')}: "
                    + ", ".join(
                        f"{k} {mb(v['bytes'])} ({v['files']:,} files)" for k, v in tree.items()
                    )
                )
        if sizes.get("after_gc"):
            print(f"  ledger after gc: {mb(sizes['after_gc']['ledger_bytes']['total'])}")
            kept = sizes["after_gc"].get("last_night_kept_bytes")
            counted = sum(
                v["bytes"] for k, v in sizes["after_gc"].get("output", {}).items() if k in _COUNTED
            )
            print(
                f"  chunks/, changes/, manifests/ after gc: {mb(counted)}; the last night's run "
                f"needs {mb(kept)}"
            )
    if plan:
        if plan.get("log_s_per_gb") is not None:
            print(
                f"planning (the CLI's 'planned … in S s' line): {plan['log_s']:.1f} s, "
                f"{plan['log_s_per_gb']:.1f} s/GB"
            )
        probe = plan.get("probe") or {}
        if probe.get("s_per_gb") is not None:
            print(
                f"planning (plan_csv alone, own process): {probe['wall_s']:.1f} s wall, "
                f"{probe['cpu_s']:.1f} s CPU for {probe['bytes'] / 1e9:.2f} GB: "
                f"{probe['s_per_gb']:.1f} s/GB wall, {probe['cpu_s_per_gb']:.1f} CPU s/GB, "
                f"peak RSS {probe['peak_rss_mb']:.0f} MB, other cores "
                f"{probe['other_cores']:.2f}"
            )
        elif probe.get("error"):
            print(f"planning probe failed: {probe['error']}")
    for name, c in checks.items():
        print(
            f"vectors after {name}: {c['checked']:,} checked, {c['mismatches']} mismatches, "
            f"{c['sha_mismatches']} text_sha256 mismatches, {c['missing']} missing"
            + (f"; error: {c['error']}" if c["error"] else "")
        )
    for r in runs:
        if r.get("right_inputs") is not None:
            print(
                f"{r['name']}: {r['inputs_charged']} inputs charged; ideal "
                f"{r['right_inputs']} (the texts the export edited)"
            )
    noisy = [r["name"] for r in runs if (r["other_cores"] or 0) > 0.25]
    if noisy:
        print(
            f"WARNING: other processes used > 0.25 cores during {', '.join(noisy)}: those "
            "numbers are skewed"
        )


def print_nights(runs: list[dict[str, Any]], by_night: dict[str, Any]) -> None:
    """Per night: what it wrote and keeps, its task runs, CPU apart, wall, RSS; the ratios."""
    head = (
        "night",
        "written MB",
        "objects",
        "kept MB",
        "drop_ids",
        "task runs",
        "flow runs",
        "CPU s",
        "server CPU s",
        "wall s",
        "RSS MB",
    )
    lines = [head]
    for r in runs:
        if "written" not in r:
            continue
        total = r["written"]["total"]
        lines.append(
            (
                r["name"],
                _fmt(total["bytes"] / 1e6, ",.2f"),
                f"{total['files']:,}",
                _fmt((r.get("kept_bytes") or 0) / 1e6, ",.1f"),
                "-" if r.get("drop_ids") is None else f"{r['drop_ids']:,}",
                "-" if r.get("task_runs") is None else f"{r['task_runs']:,}",
                "-" if r.get("flow_runs") is None else f"{r['flow_runs']:,}",
                _fmt(r["cpu_s"]),
                _fmt(r.get("prefect_server_cpu_s")),
                _fmt(r["wall_s"]),
                _fmt(r["peak_rss_cli_mb"], ".0f"),
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    print("\nper night (written: the output's growth; kept: what gc --keep-runs 1 keeps)")
    for row in lines:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    for name, q in by_night.items():
        print(
            f"{name} / first: bytes written {_fmt(q['bytes_written'], '.4f')}, objects "
            f"{_fmt(q['objects_written'], '.4f')}, task runs {_fmt(q['task_runs'], '.3f')}, "
            f"CPU {_fmt(q['cpu'], '.3f')} (with the server's {_fmt(q['cpu_with_server'], '.3f')})"
            f", wall {_fmt(q['wall'], '.3f')}"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=_row_count,
        default=10_000_000,
        help="rows of the export (default 10,000,000)",
    )
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=[0.001, 0.01],
        help="share of texts each edited night edits, one night each (default 0.001 0.01)",
    )
    parser.add_argument(
        "--dims",
        type=int,
        default=DIMS,
        help=f"dimensions of the fake's vectors and of --dimensions (default {DIMS}; the "
        "first run's cost grows with them, a night's hardly)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=2_000,
        help="vectors checked after each night but the first (0 skips)",
    )
    parser.add_argument(
        "--gc-args",
        default="--keep-runs 1 --grace 0s",
        help="options of `embedline gc` (default '--keep-runs 1 --grace 0s')",
    )
    parser.add_argument(
        "--no-plan-probe",
        dest="plan_probe",
        action="store_false",
        help="skip timing plan_csv alone",
    )
    parser.add_argument(
        "--repo", type=Path, default=REPO, help="checkout whose CLI is measured (default this one)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the temp dir goes (default the system temp dir, or beside "
        "the repo when that disk is short)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each command, wait up to SECONDS for an idle machine",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for the CLI and the fake server"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default benchmarks/results/scale-ROWS-<UTC>.json)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    repo = args.repo.resolve()
    if not (repo / "cli" / "__main__.py").exists():
        print(f"bench_scale: error: {repo} is not an embedline checkout", file=sys.stderr)
        return 2
    started_at = dt.datetime.now(dt.UTC)
    shape = f"{args.rows}" if args.dims == DIMS else f"{args.rows}-d{args.dims}"
    out = args.out or REPO / "benchmarks" / "results" / (
        f"scale-{shape}-{started_at:%Y%m%dT%H%M%SZ}.json"
    )
    # an export (~320 bytes a row) at a time, the output (~4.2 bytes a dimension a row,
    # float32 in Parquet and the change sets), the ledger, with room to spare
    need = args.rows * (1_400 + int(4.4 * args.dims))
    tmp = make_workdir(args.workdir, need, "embedline-bench-scale-")
    machine = _machine()
    bench = cli_bench(args, tmp, repo)
    output, ledger = tmp / "out", tmp / "ledger.sqlite3"
    runs: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    sizes: dict[str, Any] = {}
    plan: dict[str, Any] = {}
    print(
        f"bench: temp dir {tmp}; measuring {repo} ({git_head(repo)['git_head']}) at "
        f"{args.rows:,} rows",
        file=sys.stderr,
        flush=True,
    )
    try:
        with running_prefect_server(tmp / "prefect-server-home") as (server, url):
            bench.env = {**bench.env, "PREFECT_API_URL": url}
            warm_up(bench, tmp, [])
            data, n = export(tmp, args.rows, "base")
            if args.plan_probe:
                plan["probe"] = plan_probe(bench, data, tmp / "probe-out", tmp / "probe.sqlite3")
            first = night(bench, "first", "base", data, n, output, ledger, server, url)
            runs.append(first)
            if first["planned_in_s"] is not None:
                plan["log_s"] = first["planned_in_s"]
                plan["log_s_per_gb"] = first["planned_in_s"] / (data.stat().st_size / 1e9)
            plan["input_bytes"] = data.stat().st_size
            data.unlink()
            nights: list[tuple[str, str, dict[str, Any]]] = [("reused-shuffled", "shuffled", {})]
            for i, fraction in enumerate(args.fractions):
                tag = synthetic.DEFAULT_TAG if i == 0 else f"edited {i + 1}"
                nights.append(
                    (f"changed-{fraction:g}", "changed", {"fraction": fraction, "tag": tag})
                )
            for name, variant, extra in nights:
                path, n = export(tmp, args.rows, variant, **extra)
                run = night(bench, name, variant, path, n, output, ledger, server, url)
                run["right_inputs"] = export.edited  # type: ignore[attr-defined]
                run["edit"] = extra or None
                runs.append(run)
                if args.sample:
                    checks[name] = check_vectors(
                        str(output),
                        run["run_key"],
                        args.rows,
                        variant,
                        sample=args.sample,
                        dims=args.dims,
                        expected_rows=n,
                        include=edited_rows(args.rows, extra["fraction"]) if extra else (),
                        **extra,
                    )
                path.unlink()
            sizes["after_last_night"] = run_sizes(output, runs[-1]["run_key"], ledger)
            runs.append(run_gc(bench, output, ledger, shlex.split(args.gc_args)))
            sizes["after_gc"] = run_sizes(output, runs[-2]["run_key"], ledger)
            sizes["after_gc"]["last_night_kept_bytes"] = runs[-2].get("kept_bytes")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    for run in runs:
        _rates(run)
    print_report(runs, sizes, plan, checks, args.rows)
    by_night = ratios(runs)
    print_nights(runs, by_night)
    results = {
        "benchmark": "bench_scale",
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**machine, "load_avg_at_end": os.getloadavg()},
        "repo": git_head(repo),
        "settings": {
            "rows": args.rows,
            "fractions": args.fractions,
            "prefect": "a running `prefect server start`, PREFECT_API_URL set",
            "dims": args.dims,
            "chunk_size": CHUNK_SIZE,
            "sample": args.sample,
            "gc_args": args.gc_args,
            "quiet_wait_s": args.quiet_wait,
            "cli_args": bench.args.cli_arg,
            "temp_dir": str(tmp) if args.keep else None,
        },
        "runs": runs,
        "ratios": by_night,
        "sizes": sizes,
        "planning": plan,
        "vector_checks": checks,
        "fake_servers": bench.servers,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
