#!/usr/bin/env python3
"""The reuse targets: a night of reused rows against the first run, locally and on S3,
and the CLI's peak RSS at two sizes.

On synthetic exports (``benchmarks/synthetic.py``: about 320 bytes a row, built from the
vendored Debian English texts, every text distinct) of ``--rows`` rows (default 1,000,000),
each CLI command measured by ``bench_cli.run_cli`` (wall time, CPU of the CLI and its
children, i.e. Prefect's temporary server, peak RSS of the CLI, stderr phases) against a
fresh fake OpenAI server (``tests.support.fake_openai``, 64 dimensions, its own process),
``embedline run --embedder openai --dimensions 64 --chunk-size 5000``:

1. **warm-up**: 1,000 rows, so Prefect's database exists before the first measured run.
2. **local**: the first run; an all-reused night (the ``shuffled`` export, same output and
   ledger: every row reused); a 10 %-deleted night (``deleted10``). Reported: wall s, CPU s,
   peak RSS, rows reused (the CLI's summary), inputs charged (the fake server's counters),
   and the ratio reused-night CPU / first-run CPU (target <= 0.25).
3. **small**: the first run and the shuffled night at ``--small-rows`` (100,000): peak RSS at
   the small size against the large one (target: both under 600 MB, the larger within 1.2x
   of the smaller).
4. **s3**: ``python -m moto.server`` as its own process; the first run to
   ``s3://BUCKET/out`` at ``--s3-rows`` (default ``--rows``), then the shuffled export with a
   fresh ledger (a new machine pointed at existing output). Reuse rows/s (target >= 10,000)
   = rows reused / seconds of the reuse stage: the ``reuse stage: R rows from O objects in
   S s`` log line when the CLI prints one, else the embed phase as bench_cli defines it
   (the ``K to embed`` line to the last ``chunk N:`` line); the report says which.
5. **server** (``--running-server``): the local first run and all-reused night again, against
   a ``prefect server start`` already running (how deployments run, as ``bench_cli``'s
   item-4 pairs), each run's CPU counting the server's CPU during it (it and its children), not
   its start-up; the same 0.25 target reported for this pair.
6. After each reused night, ``--sample`` (2,000) published vectors, read back with
   ``tasks.load.read_run`` from the chunk objects the run's manifest lists, are compared with
   ``expected_matrix`` of their texts: exact float32 equality.

Prints a table with MET/MISSED per target (never asserted) beside the before figures
(``--before``, default the committed baseline ``benchmarks/results/reuse-before-main-*.json``),
writes JSON to ``--out`` (default ``benchmarks/results/reuse-<UTC time>.json``). ``--repo PATH``
runs another checkout's CLI (the before figures). About 10-15 minutes at 1M rows on 2 cores;
code that copies reused rows slowly takes longer::

    python benchmarks/bench_reuse.py [--rows 1000000] [--s3-rows N] [--small-rows 100000]
        [--repo PATH] [--running-server] [--quiet-wait 60] [--workdir DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import synthetic  # noqa: E402
from bench_cli import (  # noqa: E402
    Bench,
    RunResult,
    _descendants,
    _fmt,
    _machine,
    _proc_cpu_s,
    running_prefect_server,
)

DIMS = 64
CHUNK_SIZE = 5_000
DEFAULT_BEFORE = REPO / "benchmarks" / "results" / "reuse-before-main-f605900.json"

# Targets (reported as MET / MISSED; never asserted).
TARGET_CPU_RATIO = 0.25
TARGET_S3_ROWS_S = 10_000.0
TARGET_RSS_MB = 600.0
TARGET_RSS_GROWTH = 1.2

_REUSE_STAGE = re.compile(
    r"reuse stage: (?P<rows>[\d,]+) rows from (?P<objects>[\d,]+) objects in (?P<s>[\d.]+) s"
)
_REUSE_INDEX = re.compile(r"reuse index: ([\d,]+) new chunk objects indexed in ([\d.]+) s")
_SUMMARY_REUSE = re.compile(r"^reuse\s+([\d,]+) rows reused", re.MULTILINE)
_SUMMARY_RUN = re.compile(r"^run\s+([0-9a-f]{64})", re.MULTILINE)
_PLANNED_IN = re.compile(r"planned .* in ([\d.]+) s")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


# -- the measured checkout, the work dir ---------------------------------------------------


def git_head(repo: Path) -> dict[str, Any]:
    """HEAD of ``repo`` and how many tracked files differ from it (read-only git commands)."""

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", "-C", str(repo), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "path": str(repo),
        "git_head": git("rev-parse", "HEAD"),
        "git_modified_files": None if status is None else len(status.splitlines()),
    }


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def make_workdir(workdir: Path | None, need_bytes: int, prefix: str) -> Path:
    """A fresh temp dir under ``workdir``; by default under the system temp dir, or beside
    the repo (``/work``) when the temp dir's disk has less than ``need_bytes`` free."""
    if workdir is None:
        workdir = Path(tempfile.gettempdir())
        if free_bytes(workdir) < need_bytes and free_bytes(REPO.parent) > free_bytes(workdir):
            workdir = REPO.parent
    workdir.mkdir(parents=True, exist_ok=True)
    free = free_bytes(workdir)
    if free < need_bytes:
        print(
            f"bench: warning: {workdir} has {free / 1e9:.1f} GB free, this run needs about "
            f"{need_bytes / 1e9:.1f} GB",
            file=sys.stderr,
        )
    return Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))


def cli_bench(
    args: argparse.Namespace, tmp: Path, repo: Path, *, cli_args: Sequence[str] = ()
) -> Bench:
    """A ``bench_cli.Bench`` whose runs are ``python -m cli run … --embedder openai
    --dimensions D --chunk-size 5000`` from ``repo`` against a D-dim fake server (D:
    ``args.dims`` when given, else 64)."""
    dims = getattr(args, "dims", None) or DIMS
    options = argparse.Namespace(
        python=args.python,
        allow_failed_rows=False,
        quiet_wait=args.quiet_wait,
        prefect_api_url=None,
        dims=dims,
        cli_arg=["--dimensions", str(dims), "--chunk-size", str(CHUNK_SIZE), *cli_args],
    )
    bench = Bench(options, tmp)
    bench.env["PYTHONPATH"] = str(repo)  # the measured checkout's modules, not this one's
    return bench


def export(tmp: Path, rows: int, variant: str, **kwargs: Any) -> tuple[Path, int]:
    """Write the synthetic export; return ``(path, rows in it)``. The texts it edited
    (``changed``) are in ``export.edited``."""
    suffix = f"-{kwargs['fraction']}" if "fraction" in kwargs else ""
    path = tmp / f"synthetic-{rows}-{variant}{suffix}.csv"
    started = time.perf_counter()
    done = synthetic.write_export(rows, path, variant, **kwargs)
    print(
        f"bench: wrote {path.name}: {done['rows']:,} rows, {done['bytes'] / 1e6:,.0f} MB in "
        f"{time.perf_counter() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    export.edited = done["edited"]  # type: ignore[attr-defined]
    return path, done["rows"]


# -- moto as its own process ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MotoProcess:
    """``python -m moto.server -H 127.0.0.1 -p PORT`` in its own process group (so it does not
    share the benchmark's GIL); ``stop()`` kills the group. Use as a context manager."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def __enter__(self) -> MotoProcess:
        for _attempt in range(3):
            port = _free_port()
            self.proc = subprocess.Popen(
                [self.python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.endpoint = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2).close()
                    return self
                except OSError:
                    time.sleep(0.2)
            self.stop()
        raise RuntimeError("moto server did not start (python -m moto.server)")

    def cpu_s(self) -> float:
        return 0.0 if self.proc is None else _proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` pointed at this server with moto's dummy credentials (no real AWS_*)."""
        from tests.support.moto_server import moto_env

        return moto_env(self.endpoint, base)

    def create_bucket(self, name: str) -> None:
        from tests.support.moto_server import make_s3_client

        with _environ(self.env(dict(os.environ))):
            client = make_s3_client(self.endpoint)
            client.create_bucket(Bucket=name)
            client.close()


@contextlib.contextmanager
def _environ(env: dict[str, str] | None) -> Iterator[None]:
    """Run the block with ``os.environ`` replaced by ``env`` (None: unchanged)."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# -- one measured command ------------------------------------------------------------------


def measure(
    bench: Bench,
    name: str,
    dataset: str,
    rows: int,
    data: Path,
    output: Path | str,
    ledger: Path,
    *,
    moto: MotoProcess | None = None,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """``bench.measure`` one ``run``; return the figures this benchmark reports (``run``
    holds all of bench_cli's). The CPU of the benchmark's own servers during the run, moto
    and (``server_pid``) a running Prefect server, is taken out of ``other cores`` and
    reported apart (``moto_cpu_s``; ``prefect_server_cpu_s`` and ``cpu_with_server_s``, the
    CLI's CPU plus the server's)."""
    saved_env = bench.env
    if moto is not None:
        bench.env = moto.env(saved_env)
    moto0 = moto.cpu_s() if moto is not None else 0.0
    server0 = _tree_cpu_s(server_pid) if server_pid is not None else 0.0
    try:
        result = bench.measure(name, dataset, rows, data, output, ledger)  # type: ignore[arg-type]
    finally:
        bench.env = saved_env
    extra: dict[str, Any] = {"moto_cpu_s": moto.cpu_s() - moto0 if moto is not None else None}
    ours = extra["moto_cpu_s"] or 0.0
    if server_pid is not None:
        server_cpu = _tree_cpu_s(server_pid) - server0
        extra |= {
            "prefect_server_cpu_s": server_cpu,
            "cpu_with_server_s": (result.cpu_s or 0.0) + server_cpu,
        }
        ours += server_cpu
    if ours and result.other_cpu_s is not None:
        result.other_cpu_s = max(0.0, result.other_cpu_s - ours)
    return describe(result, bench.tmp / f"{name}.stderr.log", **extra)


def describe(result: RunResult, log_path: Path, **extra: Any) -> dict[str, Any]:
    """The figures of one run: bench_cli's, plus rows reused (the CLI summary's ``reuse``
    line), the run key, the reuse stage and reuse index lines, the planning time if logged."""
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    out: dict[str, Any] = {
        "name": result.name,
        "dataset": result.dataset,
        "rows": result.rows_input,
        "exit_code": result.exit_code,
        "wall_s": result.wall_s,
        "cpu_s": result.cpu_s,
        "cli_self_cpu_s": result.cli_self_cpu_s,
        "peak_rss_cli_mb": result.peak_rss_cli_mb,
        "peak_rss_children_mb": result.peak_rss_children_mb,
        "inputs_charged": result.server_inputs,
        "requests": result.server_requests,
        "rows_published": result.rows_published,
        "flow_wall_s": result.flow_wall_s,
        "startup_s": result.startup_s,
        "embed_phase_s": result.embed_phase_s,
        "plan_s": result.plan_s,
        "other_cpu_s": result.other_cpu_s,
        "other_cores": (
            None
            if result.other_cpu_s is None or not result.wall_s
            else result.other_cpu_s / result.wall_s
        ),
        "quiet_wait_s": result.quiet_wait_s,
        **extra,
        "rows_reused": None,
        "run_key": None,
        "reuse_stage": None,
        "reuse_index": None,
        "planned_in_s": None,
    }
    if m := _SUMMARY_REUSE.search(result.stdout):
        out["rows_reused"] = _int(m.group(1))
    if m := _SUMMARY_RUN.search(result.stdout):
        out["run_key"] = m.group(1)
    if m := _REUSE_STAGE.search(log):
        out["reuse_stage"] = {
            "rows": _int(m["rows"]),
            "objects": _int(m["objects"]),
            "seconds": float(m["s"]),
        }
    if m := _REUSE_INDEX.search(log):
        out["reuse_index"] = {"objects": _int(m.group(1)), "seconds": float(m.group(2))}
    if m := _PLANNED_IN.search(log):
        out["planned_in_s"] = float(m.group(1))
    out["bench_cli"] = asdict(result)
    return out


def reuse_rate(run: dict[str, Any]) -> dict[str, Any]:
    """Rows reused per second of the reuse stage: from its log line if the CLI prints one,
    else over bench_cli's embed phase (every chunk of a reused night is a copy)."""
    stage = run.get("reuse_stage")
    if stage and stage["seconds"] > 0:
        return {
            "rows_per_s": stage["rows"] / stage["seconds"],
            "rows": stage["rows"],
            "seconds": stage["seconds"],
            "objects": stage["objects"],
            "source": "the CLI's 'reuse stage: … in S s' line",
        }
    rows, seconds = run.get("rows_reused"), run.get("embed_phase_s")
    if rows and seconds:
        return {
            "rows_per_s": rows / seconds,
            "rows": rows,
            "seconds": seconds,
            "objects": None,
            "source": "fallback: bench_cli's embed phase ('K to embed' line to the last "
            "'chunk N:' line; no 'reuse stage' line in the log)",
        }
    return {
        "rows_per_s": None,
        "rows": rows,
        "seconds": seconds,
        "objects": None,
        "source": "not measured (no reuse stage line, no embed phase)",
    }


# -- the published vectors against the fake server's ---------------------------------------


def sample_rows(rows: int, variant: str, sample: int, seed: int = 24) -> list[int]:
    """``sample`` base row numbers the variant holds (deterministic)."""
    rng = random.Random(seed)
    picked = rng.sample(range(rows), min(rows, sample * 2 if variant == "deleted10" else sample))
    if variant == "deleted10":
        picked = [k for k in picked if not synthetic.is_deleted(k)]
    return sorted(picked[:sample])


def check_vectors(
    output: str,
    run_key: str | None,
    rows: int,
    variant: str,
    *,
    sample: int = 2_000,
    dims: int = DIMS,
    env: dict[str, str] | None = None,
    expected_rows: int | None = None,
    fraction: float = synthetic.DEFAULT_FRACTION,
    tag: str = synthetic.DEFAULT_TAG,
    include: Sequence[int] = (),
) -> dict[str, Any]:
    """Read the run's chunk objects (the ones its manifest lists, each checked against the
    manifest's SHA-256) and compare ``sample`` rows' vectors with ``expected_matrix`` of their
    texts, bit for bit; also each row's ``text_sha256``. ``env``: the environment for the
    store (moto's, for S3); ``fraction`` and ``tag``: the ``changed`` export's; ``include``:
    base rows checked besides the sample (e.g. edited ones). Never raises: an error is reported
    in the result."""
    import numpy as np

    from tests.support.fake_openai import expected_matrix

    picked = sorted({*sample_rows(rows, variant, sample), *include})
    want = {synthetic.row_id(k): k for k in picked}
    result: dict[str, Any] = {
        "sampled": len(want),
        "checked": 0,
        "mismatches": 0,
        "sha_mismatches": 0,
        "missing": 0,
        "duplicates": 0,
        "rows_in_run": 0,
        "expected_rows": expected_rows,
        "error": None,
    }
    seen: set[str] = set()
    started = time.perf_counter()
    try:
        with _environ(env):
            from adapters.object_store import open_store
            from tasks.load.read_run import chunk_tables, resolve_run

            store = open_store(output)
            manifest = resolve_run(store, run_key)
            result["run_key"] = str(manifest["run_key"])
            for _entry, table in chunk_tables(store, manifest):
                result["rows_in_run"] += table.num_rows
                ids = table.column("id").to_pylist()
                hits = [i for i, row in enumerate(ids) if row in want]
                if not hits:
                    continue
                column = table.column("embedding").combine_chunks()
                flat = column.flatten().to_numpy(zero_copy_only=False)
                got = np.asarray(flat, dtype=np.float32).reshape(len(column), -1)[hits]
                ks = [want[ids[i]] for i in hits]
                texts = [synthetic.text_of(k, variant, fraction, tag) for k in ks]
                expected = expected_matrix(texts, dims)
                shas = table.column("text_sha256").to_pylist()
                for n, i in enumerate(hits):
                    if ids[i] in seen:
                        result["duplicates"] += 1
                    seen.add(ids[i])
                    result["checked"] += 1
                    if got.shape[1] != dims or not np.array_equal(got[n], expected[n]):
                        result["mismatches"] += 1
                    if shas[i] != hashlib.sha256(texts[n].encode("utf-8")).hexdigest():
                        result["sha_mismatches"] += 1
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the figures above stand
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    result["missing"] = len(want) - len(seen)
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["ok"] = (
        result["error"] is None
        and result["mismatches"] == 0
        and result["sha_mismatches"] == 0
        and result["missing"] == 0
        and result["duplicates"] == 0
        and (expected_rows is None or result["rows_in_run"] == expected_rows)
    )
    print(
        f"bench: vectors of {output} ({variant}): {result['checked']:,} checked, "
        f"{result['mismatches']} mismatches, {result['missing']} missing"
        + (f", error {result['error']}" if result["error"] else ""),
        file=sys.stderr,
        flush=True,
    )
    return result


# -- the scenario --------------------------------------------------------------------------


def warm_up(bench: Bench, tmp: Path, runs: list[dict[str, Any]]) -> None:
    """1,000 rows with a throwaway output, so the first measured run does not pay for
    creating Prefect's database in the fresh PREFECT_HOME."""
    data, rows = export(tmp, 1_000, "base")
    runs.append(
        measure(
            bench,
            "warm-up",
            "warm-up",
            rows,
            data,
            tmp / "warm-up-out",
            tmp / "warm-up-ledger.sqlite3",
        )
    )


def local_nights(
    bench: Bench,
    tmp: Path,
    rows: int,
    *,
    prefix: str,
    sample: int,
    deleted: bool,
    runs: list[dict[str, Any]],
    checks: dict[str, Any],
) -> None:
    """First run, shuffled night (and the 10 %-deleted night) on one output and ledger."""
    out, ledger = tmp / f"{prefix}-out", tmp / f"{prefix}-ledger.sqlite3"
    data, n = export(tmp, rows, "base")
    runs.append(measure(bench, f"{prefix}-first", "base", n, data, out, ledger))
    nights = [("shuffled", "reused-shuffled")] + ([("deleted10", "deleted10")] if deleted else [])
    for variant, name in nights:
        night, n = export(tmp, rows, variant)
        run = measure(bench, f"{prefix}-{name}", variant, n, night, out, ledger)
        runs.append(run)
        if sample:
            checks[run["name"]] = check_vectors(
                str(out), run["run_key"], rows, variant, sample=sample, expected_rows=n
            )
        night.unlink()
    data.unlink()


def _tree_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its live descendants, seconds."""
    return sum(_proc_cpu_s(p) for p in (pid, *_descendants(pid)))


def server_nights(
    bench: Bench,
    tmp: Path,
    rows: int,
    *,
    sample: int,
    runs: list[dict[str, Any]],
    checks: dict[str, Any],
) -> None:
    """The first run and the all-reused night against a running Prefect server (module
    docstring, step 5): ``cpu_s`` is the CLI's, ``prefect_server_cpu_s`` the server's during
    the run, ``cpu_with_server_s`` their sum."""
    saved = bench.env
    out, ledger = tmp / "server-out", tmp / "server-ledger.sqlite3"
    with running_prefect_server(tmp / "prefect-server-home") as (server, url):
        bench.env = {**saved, "PREFECT_API_URL": url}
        try:
            for variant, name in (("base", "server-first"), ("shuffled", "server-reused-shuffled")):
                data, n = export(tmp, rows, variant)
                run = measure(bench, name, variant, n, data, out, ledger, server_pid=server.pid)
                runs.append(run)
                if sample and variant == "shuffled":
                    checks[name] = check_vectors(
                        str(out), run["run_key"], rows, variant, sample=sample, expected_rows=n
                    )
                data.unlink()
        finally:
            bench.env = saved


def s3_nights(
    bench: Bench,
    tmp: Path,
    rows: int,
    *,
    sample: int,
    python: str,
    runs: list[dict[str, Any]],
    checks: dict[str, Any],
) -> None:
    """First run to s3://BUCKET/out on moto, then the shuffled export with a fresh ledger."""
    data, n = export(tmp, rows, "base")
    night, n_night = export(tmp, rows, "shuffled")
    bucket = f"embedline-bench-{os.getpid()}"
    output = f"s3://{bucket}/out"
    with MotoProcess(python) as moto:
        print(
            f"bench: moto server at {moto.endpoint}, bucket {bucket}", file=sys.stderr, flush=True
        )
        moto.create_bucket(bucket)
        runs.append(
            measure(
                bench, "s3-first", "base", n, data, output, tmp / "s3-ledger.sqlite3", moto=moto
            )
        )
        run = measure(
            bench,
            "s3-fresh-ledger-shuffled",
            "shuffled",
            n_night,
            night,
            output,
            tmp / "s3-ledger-fresh.sqlite3",
            moto=moto,
        )
        runs.append(run)
        if sample:
            checks[run["name"]] = check_vectors(
                output,
                run["run_key"],
                rows,
                "shuffled",
                sample=sample,
                env=moto.env(dict(os.environ)),
                expected_rows=n_night,
            )
    data.unlink()
    night.unlink()


# -- figures, targets, table ---------------------------------------------------------------


def summarize(
    runs: list[dict[str, Any]], checks: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    by = {r["name"]: r for r in runs}

    def get(name: str, key: str) -> Any:
        return by[name][key] if name in by else None

    def ratio(a: Any, b: Any) -> float | None:
        return None if a is None or not b else a / b

    s3 = reuse_rate(by["s3-fresh-ledger-shuffled"]) if "s3-fresh-ledger-shuffled" in by else {}
    small = args.small_rows if args.small_rows and args.small_rows != args.rows else None
    rss_rows = max(
        (
            get(n, "peak_rss_cli_mb") or 0
            for n in ("local-first", "local-reused-shuffled", "local-deleted10")
        ),
        default=0,
    )
    rss_small = (
        max(
            (get(n, "peak_rss_cli_mb") or 0 for n in ("small-first", "small-reused-shuffled")),
            default=0,
        )
        if small
        else None
    )
    return {
        "rows": args.rows,
        "s3_rows": args.s3_rows,
        "small_rows": small,
        "first_cpu_s": get("local-first", "cpu_s"),
        "first_wall_s": get("local-first", "wall_s"),
        "reused_cpu_s": get("local-reused-shuffled", "cpu_s"),
        "reused_wall_s": get("local-reused-shuffled", "wall_s"),
        "deleted_cpu_s": get("local-deleted10", "cpu_s"),
        "deleted_wall_s": get("local-deleted10", "wall_s"),
        "reused_cpu_ratio": ratio(
            get("local-reused-shuffled", "cpu_s"), get("local-first", "cpu_s")
        ),
        "deleted_cpu_ratio": ratio(get("local-deleted10", "cpu_s"), get("local-first", "cpu_s")),
        "server_first_cpu_s": get("server-first", "cpu_with_server_s"),
        "server_reused_cpu_s": get("server-reused-shuffled", "cpu_with_server_s"),
        "server_reused_cpu_ratio": ratio(
            get("server-reused-shuffled", "cpu_with_server_s"),
            get("server-first", "cpu_with_server_s"),
        ),
        "reused_inputs_charged": get("local-reused-shuffled", "inputs_charged"),
        "deleted_inputs_charged": get("local-deleted10", "inputs_charged"),
        "s3_first_wall_s": get("s3-first", "wall_s"),
        "s3_reuse_wall_s": get("s3-fresh-ledger-shuffled", "wall_s"),
        "s3_reuse_cpu_s": get("s3-fresh-ledger-shuffled", "cpu_s"),
        "s3_reuse_inputs_charged": get("s3-fresh-ledger-shuffled", "inputs_charged"),
        "s3_reuse_rows_per_s": s3.get("rows_per_s"),
        "s3_reuse_rows": s3.get("rows"),
        "s3_reuse_seconds": s3.get("seconds"),
        "s3_reuse_source": s3.get("source"),
        "rss_small_mb": rss_small,
        "rss_rows_mb": rss_rows or None,
        "rss_growth": ratio(rss_rows, rss_small),
        "vectors_checked": sum(c["checked"] for c in checks.values()),
        "vector_mismatches": sum(c["mismatches"] + c["sha_mismatches"] for c in checks.values()),
        "vector_checks_ok": all(c["ok"] for c in checks.values()) if checks else None,
    }


def targets_of(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    def met(value: Any, ok: bool) -> dict[str, Any]:
        return {"value": value, "met": value is not None and ok}

    r, d = s["reused_cpu_ratio"], s["deleted_cpu_ratio"]
    t: dict[str, dict[str, Any]] = {}
    if r is not None:
        t[
            f"all-reused night (shuffled) CPU / first run's <= {TARGET_CPU_RATIO} "
            f"({s['rows']:,} rows, local)"
        ] = met(r, r <= TARGET_CPU_RATIO)
    if d is not None:
        t[f"10 %-deleted night CPU / first run's <= {TARGET_CPU_RATIO} (also every row reused)"] = (
            met(d, d <= TARGET_CPU_RATIO)
        )
    g = s.get("server_reused_cpu_ratio")
    if g is not None:
        t[
            f"all-reused night (shuffled) CPU / first run's <= {TARGET_CPU_RATIO} "
            f"({s['rows']:,} rows, local, running Prefect server: its CPU during each run "
            "counted)"
        ] = met(g, g <= TARGET_CPU_RATIO)
    if s["s3_reuse_rows_per_s"] is not None:
        t[f"S3 reuse (fresh ledger, {s['s3_rows']:,} rows) >= {TARGET_S3_ROWS_S:,.0f} rows/s"] = (
            met(s["s3_reuse_rows_per_s"], s["s3_reuse_rows_per_s"] >= TARGET_S3_ROWS_S)
        )
    if s["rss_small_mb"] is not None:
        t[f"peak RSS of the CLI at {s['small_rows']:,} rows < {TARGET_RSS_MB:.0f} MB"] = met(
            s["rss_small_mb"], s["rss_small_mb"] < TARGET_RSS_MB
        )
    if s["rss_rows_mb"] is not None:
        t[f"peak RSS of the CLI at {s['rows']:,} rows < {TARGET_RSS_MB:.0f} MB"] = met(
            s["rss_rows_mb"], s["rss_rows_mb"] < TARGET_RSS_MB
        )
    if s["rss_growth"] is not None:
        t[f"peak RSS at {s['rows']:,} rows / at {s['small_rows']:,} <= {TARGET_RSS_GROWTH}"] = met(
            s["rss_growth"], s["rss_growth"] <= TARGET_RSS_GROWTH
        )
    for key, label in (
        ("reused_inputs_charged", "all-reused night"),
        ("deleted_inputs_charged", "10 %-deleted night"),
        ("s3_reuse_inputs_charged", "S3 fresh-ledger night"),
    ):
        if s[key] is not None:
            t[f"{label}: 0 inputs charged"] = met(s[key], s[key] == 0)
    if s["vector_checks_ok"] is not None:
        t["reused vectors equal the fake server's, bit for bit (sampled)"] = met(
            f"{s['vectors_checked']:,} checked, {s['vector_mismatches']} mismatches",
            bool(s["vector_checks_ok"]),
        )
    return t


def load_before(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_text())
    return {
        "file": str(path),
        "summary": data.get("summary", {}),
        "repo": data.get("repo", {}),
        "started_at": data.get("started_at"),
    }


_TABLE_FIGURES = (
    ("first run CPU s (local)", "first_cpu_s", ".1f", "rows"),
    ("first run wall s (local)", "first_wall_s", ".1f", "rows"),
    ("all-reused night CPU s (shuffled)", "reused_cpu_s", ".1f", "rows"),
    ("all-reused night wall s", "reused_wall_s", ".1f", "rows"),
    ("10 %-deleted night CPU s", "deleted_cpu_s", ".1f", "rows"),
    ("reused-night CPU / first-run CPU (<= 0.25)", "reused_cpu_ratio", ".2f", "rows"),
    ("deleted-night CPU / first-run CPU", "deleted_cpu_ratio", ".2f", "rows"),
    ("running server: first run CPU s (+server)", "server_first_cpu_s", ".1f", "rows"),
    ("running server: reused night CPU s (+server)", "server_reused_cpu_s", ".1f", "rows"),
    ("running server: reused / first (<= 0.25)", "server_reused_cpu_ratio", ".2f", "rows"),
    ("S3 first run wall s", "s3_first_wall_s", ".1f", "s3_rows"),
    ("S3 fresh-ledger night wall s", "s3_reuse_wall_s", ".1f", "s3_rows"),
    ("S3 reuse rows/s (>= 10,000)", "s3_reuse_rows_per_s", ",.0f", "s3_rows"),
    ("peak RSS MB, small size (< 600)", "rss_small_mb", ".0f", "small_rows"),
    ("peak RSS MB, --rows (< 600)", "rss_rows_mb", ".0f", "rows"),
    ("peak RSS growth (<= 1.2)", "rss_growth", ".2f", "rows"),
)


def print_report(
    runs: list[dict[str, Any]],
    checks: dict[str, Any],
    summary: dict[str, Any],
    targets: dict[str, Any],
    before: dict[str, Any] | None,
) -> None:
    head = (
        "run",
        "rows",
        "exit",
        "wall s",
        "CPU s",
        "RSS cli MB",
        "reused",
        "charged",
        "embed s",
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
                _fmt(r["cpu_s"]),
                _fmt(r["peak_rss_cli_mb"], ".0f"),
                "-" if r["rows_reused"] is None else f"{r['rows_reused']:,}",
                "-" if r["inputs_charged"] is None else f"{r['inputs_charged']:,}",
                _fmt(r["embed_phase_s"]),
                _fmt(r["other_cores"], ".2f"),
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    print()
    for row in lines:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    noisy = [r["name"] for r in runs if (r["other_cores"] or 0) > 0.25]
    if noisy:
        print(
            f"WARNING: other processes used > 0.25 cores during {', '.join(noisy)}: those "
            "numbers are skewed (rerun with --quiet-wait 120 on a quieter machine)"
        )
    for r in runs:
        if r.get("reuse_stage") or r.get("reuse_index"):
            print(
                f"  {r['name']}: reuse stage {r.get('reuse_stage')}, reuse index "
                f"{r.get('reuse_index')}"
            )
    for r in runs:
        if r.get("prefect_server_cpu_s") is not None:
            print(
                f"  {r['name']}: CLI {r['cpu_s']:.1f} CPU s + running Prefect server "
                f"{r['prefect_server_cpu_s']:.1f} = {r['cpu_with_server_s']:.1f}"
            )
    if summary.get("s3_reuse_source"):
        print(f"S3 reuse rows/s measured by {summary['s3_reuse_source']}")
    for name, c in checks.items():
        print(
            f"vectors after {name}: {c['checked']:,} of {c['sampled']:,} sampled checked, "
            f"{c['mismatches']} mismatches, {c['sha_mismatches']} text_sha256 mismatches, "
            f"{c['missing']} missing, {c['rows_in_run']:,} rows in the run"
            + (f"; error: {c['error']}" if c["error"] else "")
        )
    b = (before or {}).get("summary", {})
    label = "before"
    if before:
        head_commit = (before.get("repo") or {}).get("git_head") or "?"
        label = f"before ({head_commit[:7]})"
        print(f"\nbefore figures: {before['file']} (run {before.get('started_at')})")
    print(f"\n{'figure':<44} {'now':>14} {label:>18}")

    def cell(s: dict[str, Any], key: str, spec: str, rows_key: str) -> str:
        value = s.get(key)
        if value is None:
            return "-"
        rows = s.get(rows_key)
        return f"{format(value, spec)} @{rows / 1000:,.0f}k" if rows else format(value, spec)

    for title, key, spec, rows_key in _TABLE_FIGURES:
        print(
            f"{title:<44} {cell(summary, key, spec, rows_key):>14} "
            f"{cell(b, key, spec, rows_key):>18}"
        )
    print()
    for key, value in targets.items():
        shown = value["value"]
        if isinstance(shown, float):
            shown = f"{shown:,.3f}" if shown < 10 else f"{shown:,.0f}"
        print(f"target {'MET   ' if value['met'] else 'MISSED'} {key}: {shown}")


# -- main ----------------------------------------------------------------------------------


def _row_count(text: str) -> int:
    """An export's row count for argparse: 1 .. ``synthetic.MAX_ROWS``."""
    try:
        rows = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of rows: {text!r}") from None
    if not 1 <= rows <= synthetic.MAX_ROWS:
        raise argparse.ArgumentTypeError(f"must be 1..{synthetic.MAX_ROWS:,}, got {rows:,}")
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=_row_count,
        default=1_000_000,
        help="rows of the local export (default 1,000,000)",
    )
    parser.add_argument(
        "--s3-rows",
        type=int,
        default=None,
        help="rows of the S3 export (default --rows; 0 skips S3)",
    )
    parser.add_argument(
        "--small-rows",
        type=int,
        default=100_000,
        help="the small size of the RSS comparison (0 skips it)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=2_000,
        help="vectors checked after each reused night (0 skips the check)",
    )
    parser.add_argument(
        "--no-deleted", dest="deleted", action="store_false", help="skip the 10 %%-deleted night"
    )
    parser.add_argument(
        "--running-server",
        action="store_true",
        help="also the first run and the all-reused night against a running "
        "Prefect server, its CPU during each run counted",
    )
    parser.add_argument(
        "--repo", type=Path, default=REPO, help="checkout whose CLI is measured (default this one)"
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=DEFAULT_BEFORE,
        help="before figures printed beside these (a reuse JSON)",
    )
    parser.add_argument("--no-before", dest="before", action="store_const", const=None)
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
        help="before each run, wait up to SECONDS for an idle machine",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for the CLI, the fake server and moto"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default benchmarks/results/reuse-<UTC>.json)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.s3_rows is None:
        args.s3_rows = args.rows
    repo = args.repo.resolve()
    if not (repo / "cli" / "__main__.py").exists():
        print(f"bench_reuse: error: {repo} is not an embedline checkout", file=sys.stderr)
        return 2
    started_at = dt.datetime.now(dt.UTC)
    out = args.out or REPO / "benchmarks" / "results" / f"reuse-{started_at:%Y%m%dT%H%M%SZ}.json"
    need = max(args.rows, args.s3_rows) * 2_500  # two exports, three outputs, the ledger
    tmp = make_workdir(args.workdir, need, "embedline-bench-reuse-")
    machine = _machine()
    bench = cli_bench(args, tmp, repo)
    runs: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    print(
        f"bench: temp dir {tmp}; measuring {repo} ({git_head(repo)['git_head']})",
        file=sys.stderr,
        flush=True,
    )
    try:
        warm_up(bench, tmp, runs)
        local_nights(
            bench,
            tmp,
            args.rows,
            prefix="local",
            sample=args.sample,
            deleted=args.deleted,
            runs=runs,
            checks=checks,
        )
        if args.small_rows and args.small_rows != args.rows:
            local_nights(
                bench,
                tmp,
                args.small_rows,
                prefix="small",
                sample=0,
                deleted=False,
                runs=runs,
                checks=checks,
            )
        if args.s3_rows:
            s3_nights(
                bench,
                tmp,
                args.s3_rows,
                sample=args.sample,
                python=args.python,
                runs=runs,
                checks=checks,
            )
        if args.running_server:
            server_nights(bench, tmp, args.rows, sample=args.sample, runs=runs, checks=checks)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(runs, checks, args)
    targets = targets_of(summary)
    before = load_before(args.before)
    print_report(runs, checks, summary, targets, before)
    results = {
        "benchmark": "bench_reuse",
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**machine, "load_avg_at_end": os.getloadavg()},
        "repo": git_head(repo),
        "settings": {
            "rows": args.rows,
            "s3_rows": args.s3_rows,
            "small_rows": args.small_rows,
            "dims": DIMS,
            "chunk_size": CHUNK_SIZE,
            "sample": args.sample,
            "quiet_wait_s": args.quiet_wait,
            "cli_args": bench.args.cli_arg,
            "temp_dir": str(tmp) if args.keep else None,
        },
        "summary": summary,
        "targets": targets,
        "before": before
        and {"file": before["file"], "summary": before["summary"], "repo": before["repo"]},
        "vector_checks": checks,
        "runs": runs,
        "fake_servers": bench.servers,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
