"""The change set of a shuffled night: the in-memory diff (``tasks/commit/changes.py`` of
``--old-rev``, read from git) against the sort-merge one, peak RSS and seconds, as ratios.

::

    python benchmarks/bench_changes.py [--rows 100000 1000000 10000000] [--dir DIR]
                                       [--old-rev REV] [--old-max-rows N]

For each row count it generates (once, kept in ``--dir``) two runs of synthetic keys in
chunk objects of 5,000 rows, columns ``id`` and ``text_sha256`` only (the vectors are never
read by a diff): the base run in id order, and a *shuffled night*, the same ids in random
order with 1 % deleted, 1 % added and 1 % of texts changed, so no chunk object is shared and
every key of both runs is read, sorted and joined: the worst case for memory.

Each implementation runs in its own process with the CLI's allocator settings (pyarrow's
system pool, two malloc arenas: ``adapters/memory.py``), measured by the parent: wall
seconds, CPU seconds (user + system, ``wait4``), peak RSS (``ru_maxrss``) and the process's
RSS just before the diff (interpreter, pyarrow, the chunk lists): ``peak - before`` is what
the change set costs in a fresh process, including pyarrow's first-use costs (thread pools,
allocator arenas) that a CLI run has already paid; ``Arrow MiB`` is the pool's own peak.
CPU seconds are the fairer ratio on a shared machine: wall time waits for the CPU and, for
the new diff, for its scratch files. The two change sets are then compared row by row
(and schema with metadata): they must hold the same content. Results print as a table and
go to ``benchmarks/results/changes-<UTC time>.json``. Never asserted; Linux only (``wait4``).
The 10M data takes about 1 GB in ``--dir`` and the new diff's scratch about 2 GB more.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OLD_REV = "f605900"  # main before the sort-merge change set (its tasks/commit/changes.py)
CHUNK_ROWS = 5_000
RUN_KEY = "bench-night"
#: The allocators the CLI sets for itself (adapters/memory.py), here for both workers; an
#: explicit value in the environment wins, as it does for the CLI.
CLI_ALLOCATORS = {
    "ARROW_DEFAULT_MEMORY_POOL": os.environ.get("ARROW_DEFAULT_MEMORY_POOL", "system"),
    "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2"),
}
_HEX = np.array([[ord(c) for c in f"{b:02x}"] for b in range(256)], dtype=np.uint8)


# ------------------------------------------------------------------ synthetic runs


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64 of each value: random-looking, reproducible, random access."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _strings(matrix: np.ndarray) -> pa.Array:
    """A string array from an (n, width) uint8 matrix of ASCII codes."""
    n, width = matrix.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(matrix).tobytes())
    )


def _ids(numbers: np.ndarray) -> pa.Array:
    """``row-000000042``-style ids (13 ASCII bytes)."""
    digits = (numbers[:, None] // 10 ** np.arange(8, -1, -1)) % 10 + ord("0")
    prefix = np.tile(np.frombuffer(b"row-", dtype=np.uint8), (len(numbers), 1))
    return _strings(np.hstack([prefix, digits.astype(np.uint8)]))


def _hashes(numbers: np.ndarray, version: np.ndarray) -> pa.Array:
    """A 64-hex "text hash" per (row number, text version)."""
    lanes = [_mix(numbers * np.uint64(8) + version * np.uint64(4) + np.uint64(k)) for k in range(4)]
    raw = np.stack(lanes, axis=1).view(np.uint8).reshape(len(numbers), 32)
    return _strings(_HEX[raw].reshape(len(numbers), 64))


def _write_run(
    root: Path, name: str, numbers: np.ndarray, version: np.ndarray
) -> list[dict[str, Any]]:
    chunks = []
    for index, start in enumerate(range(0, len(numbers), CHUNK_ROWS)):
        part, ver = numbers[start : start + CHUNK_ROWS], version[start : start + CHUNK_ROWS]
        key = f"chunks/{name}-{index:06d}.parquet"
        pq.write_table(
            pa.table({"id": _ids(part), "text_sha256": _hashes(part, ver)}),
            root / key,
            compression="zstd",
        )
        chunks.append({"index": index, "object": key, "rows": len(part)})
    return chunks


def generate(root: Path, rows: int) -> dict[str, Any]:
    """The base run and the shuffled night under ``root`` (reused if already there)."""
    listing = root / "runs.json"
    if listing.exists():
        return dict(json.loads(listing.read_text()))
    (root / "chunks").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(rows)
    base = np.arange(rows, dtype=np.uint64)
    kept = base[rng.random(rows) >= 0.01]
    night = np.concatenate([kept, np.arange(rows, rows + rows // 100, dtype=np.uint64)])
    rng.shuffle(night)
    version = (rng.random(len(night)) < 0.01).astype(np.uint64)
    runs = {
        "base": {
            "run_key": "bench-base",
            "chunks": _write_run(root, "base", base, np.zeros(rows, np.uint64)),
        },
        "night": _write_run(root, "night", night, version),
    }
    listing.write_text(json.dumps(runs))
    return runs


# ------------------------------------------------------------------ one measured process


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def worker(impl: str, data: Path, out: Path, old_rev: str) -> None:
    """Compute the night's change set with ``impl`` into the store ``out``; print JSON."""
    from adapters.object_store import LocalDirStore

    runs = json.loads((data / "runs.json").read_text())
    out.mkdir(parents=True)
    (out / "chunks").symlink_to(data / "chunks")
    store = LocalDirStore(out)
    extra: dict[str, Any] = {}
    if impl == "old":
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{old_rev}:tasks/commit/changes.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        module = type(sys)("old_changes")
        sys.modules["old_changes"] = module
        exec(compile(source, f"{old_rev}:tasks/commit/changes.py", "exec"), module.__dict__)
        before = _rss_kib()
        started = time.perf_counter()
        counts = module.write_changes(
            store, run_key=RUN_KEY, chunks=runs["night"], base=runs["base"]
        )
    else:
        from tasks.commit.changes import write_changes
        from tasks.commit.sorted_spills import SortStats

        stats = SortStats()
        scratch = out / "scratch"
        scratch.mkdir()
        before = _rss_kib()
        started = time.perf_counter()
        counts = write_changes(
            store,
            run_key=RUN_KEY,
            chunks=runs["night"],
            base=runs["base"],
            scratch_dir=scratch,
            stats=stats,
        )
        extra = {"sort": {k: getattr(stats, k) for k in stats.__slots__}}
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "rss_before_kib": before,
                "arrow_peak_mib": pa.default_memory_pool().max_memory() / (1 << 20),
                "counts": counts.to_dict(),
                **extra,
            }
        )
    )


def measure(impl: str, data: Path, out: Path, old_rev: str) -> dict[str, Any]:
    """Run ``worker`` in a child process; add its CPU seconds and peak RSS (``wait4``)."""
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--worker",
            impl,
            "--data",
            str(data),
            "--out",
            str(out),
            "--old-rev",
            old_rev,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **CLI_ALLOCATORS},
    )
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{impl} worker failed with exit {child.returncode}")
    result = dict(json.loads(output))
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    result["peak_rss_mib"] = usage.ru_maxrss / 1024
    result["change_set_mib"] = (usage.ru_maxrss - result.pop("rss_before_kib")) / 1024
    return result


def same_content(a: Path, b: Path) -> bool:
    """True if two Parquet files hold the same schema (metadata included) and rows, read a
    batch at a time (their row groups may differ)."""
    fa, fb = pq.ParquetFile(a), pq.ParquetFile(b)
    if not fa.schema_arrow.equals(fb.schema_arrow, check_metadata=True):
        return False
    if fa.metadata.num_rows != fb.metadata.num_rows:
        return False
    left, right = fa.iter_batches(65_536), fb.iter_batches(65_536)
    x = y = None
    while True:
        if x is None or not x.num_rows:
            x = next(left, None)
        if y is None or not y.num_rows:
            y = next(right, None)
        if x is None or y is None:
            return x is None and y is None
        n = min(x.num_rows, y.num_rows)
        if not x.slice(0, n).equals(y.slice(0, n)):
            return False
        x, y = x.slice(n), y.slice(n)


# ------------------------------------------------------------------ the table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the synthetic runs are generated and kept (default: a "
        "new temporary directory, removed afterwards)",
    )
    parser.add_argument("--old-rev", default=OLD_REV)
    parser.add_argument(
        "--old-max-rows",
        type=int,
        default=10_000_000,
        help="skip the old diff above this many rows (it needs ~0.4 GB per M)",
    )
    parser.add_argument("--worker", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.data, args.out, args.old_rev)
        return 0
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="embedline-bench-changes-", dir=args.dir) as tmp:
        rows_results = [_one_size(Path(tmp), rows, args) for rows in args.rows]
    _report(rows_results, args.old_rev)
    return 0 if all(r.get("same_content", True) for r in rows_results) else 1


def _one_size(tmp: Path, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    data = (args.dir / f"rows-{rows}") if args.dir else tmp / f"rows-{rows}"
    started = time.perf_counter()
    generate(data, rows)
    print(f"{rows:>11,} rows: data ready in {time.perf_counter() - started:.0f} s", flush=True)
    result: dict[str, Any] = {"rows": rows}
    for impl in ("old", "new"):
        if impl == "old" and rows > args.old_max_rows:
            continue
        result[impl] = measure(impl, data, tmp / f"out-{rows}-{impl}", args.old_rev)
        print(
            f"{'':>11}  {impl}: {result[impl]['seconds']:.1f} s, "
            f"peak {result[impl]['peak_rss_mib']:.0f} MiB",
            flush=True,
        )
    if "old" in result:
        key = f"changes/{RUN_KEY}.parquet"
        result["same_content"] = same_content(
            tmp / f"out-{rows}-old" / key, tmp / f"out-{rows}-new" / key
        )
    return result


def _report(results: list[dict[str, Any]], old_rev: str) -> None:
    print(
        f"\nold = tasks/commit/changes.py at {old_rev}, new = this checkout; shuffled night, "
        f"every chunk read"
    )
    print(
        f"{'rows':>11} {'impl':>4} {'wall s':>8} {'CPU s':>8} {'peak RSS MiB':>13} "
        f"{'over start MiB':>15} {'Arrow MiB':>10} {'new/old RSS':>12} {'new/old CPU':>12} same"
    )
    for r in results:
        for impl in ("old", "new"):
            if impl not in r:
                continue
            m = r[impl]
            ratios = ""
            if impl == "new" and "old" in r:
                ratios = (
                    f"{m['peak_rss_mib'] / r['old']['peak_rss_mib']:>12.2f} "
                    f"{m['cpu_seconds'] / r['old']['cpu_seconds']:>12.2f} "
                    f"{r['same_content']}"
                )
            print(
                f"{r['rows']:>11,} {impl:>4} {m['seconds']:>8.1f} {m['cpu_seconds']:>8.1f} "
                f"{m['peak_rss_mib']:>13.0f} {m['change_set_mib']:>15.0f} "
                f"{m['arrow_peak_mib']:>10.0f} {ratios}"
            )
    new = [r for r in results if "new" in r]
    if len(new) > 1:
        low, high = new[0], new[-1]
        print(
            f"new peak RSS at {high['rows']:,} rows / at {low['rows']:,} rows: "
            f"{high['new']['peak_rss_mib'] / low['new']['peak_rss_mib']:.2f}x"
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = REPO / "benchmarks" / "results" / f"changes-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"old_rev": old_rev, "results": results}, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    raise SystemExit(main())
