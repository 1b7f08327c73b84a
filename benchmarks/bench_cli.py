#!/usr/bin/env python3
"""End-to-end benchmark of ``embedline run --embedder openai`` against a zero-latency server.

What it does, in one run on one machine (see benchmarks/README.md for what each number means):

1. Starts the fake OpenAI-compatible server (``tests.support.fake_openai``, 384 dimensions;
   the CLI asks for ``encoding_format=base64``) as its own process, one fresh server per
   measured command so its request counters belong to that command alone.
2. BASELINE: the seeds' design as a small in-script function (one request per row, the whole
   list of finished ids rewritten to a JSON checkpoint after every row) on the first
   ``--baseline-rows`` rows, so embedline's speed-up is a ratio measured here and now.
3. Runs the CLI as a subprocess on the first ``--rows-subset`` records (cut by records with
   the csv module: quoted fields span lines) and on the whole file, each with a fresh output
   directory and ledger, and measures wall time, Prefect start-up, embedding rows/s, peak RSS
   (CLI process alone; separately the largest child, i.e. Prefect's temporary server),
   requests seen by the server, and whether torch was ever mapped into the CLI process.
4. Reruns on the whole file: the same command (manifest exists), manifest deleted with the
   ledger kept (skip by ledger), manifest deleted with a fresh ledger (skip by HEAD).
5. Prints a table and writes JSON (``--out``, default ``benchmarks/results/cli-<UTC time>.json``).

Performance is reported as numbers and ratios; nothing here is a timed assertion.

Usage::

    python benchmarks/bench_cli.py [--data PATH] [--rows-subset 10000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import datetime as dt
import importlib.metadata
import io
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def default_data() -> Path:
    """The whole English file, unpacked from the copy vendored in ``tests/data``."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # tests.support: not part of the installed package
    from tests.support.real_data import ENGLISH_NAME, real_csv

    return real_csv(ENGLISH_NAME)


DIMS = 384
MODEL = "text-embedding-3-small"  # the CLI's default for --embedder openai

# Targets (reported as met / missed; never asserted).
TARGET_STEADY_ROWS_S = 5000.0
TARGET_FULL_WALL_S = 45.0
TARGET_PEAK_RSS_MB = 500.0
TARGET_RERUN_WALL_S = 5.0  # a rerun with nothing to embed
TARGET_SDK_RATIO = 1.0  # whole file, end to end: embedline at least as fast as the SDK loop
TARGET_DASK_RATIO = 0.5  # 2 local Dask workers reach half the threads runner's rows/s

_POLL_S = 0.05  # RSS sampling period of the CLI process
_TREE_EVERY = 5  # scan for descendants every _TREE_EVERY samples (0.25 s)
_MAPS_EVERY = 20  # look for torch in /proc/PID/maps every _MAPS_EVERY samples (1 s)

# Prefect's console log line: "HH:MM:SS.mmm | LEVEL   | logger - message"
_LOG_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) \| (\w+)\s*\| (.*)$")
_DISPATCH = re.compile(r"(\d+) of (\d+) chunks already published; (\d+) to embed")
# Dask only: the cluster started and its workers imported the chunk task's modules
_RUNNER_READY = re.compile(r"task runner ready: dask, \d+ workers, in ([\d.]+) s")
_CHUNK = re.compile(
    r"chunk (\d+): (\d+) rows published( \(object already existed\))?, (\d+) dead letters, "
    r"(\d+) requests, (\d+) tokens"
)
# First occurrence of each, timed by the CLI's own log clock (see _phases).
_PHASE_MARKS = (
    ("begin", re.compile(r"Beginning flow run")),
    ("planned", re.compile(r"Task run 'plan-input[^']*' - planned ")),
    ("complete", re.compile(r" is already complete: manifest ")),
    ("manifest", re.compile(r"Flow run '[^']*' - manifest (already )?committed ")),
    ("finished", re.compile(r"Flow run '[^']*' - Finished in state ")),
)
_SUMMARY_WALL = re.compile(r"^wall time\s+([\d.]+) s", re.MULTILINE)
_SUMMARY_API = re.compile(r"^api\s+([\d,]+) requests", re.MULTILINE)
_SUMMARY_STATUS = re.compile(r"^status\s+(\S+)", re.MULTILINE)
_SUMMARY_ROWS = re.compile(
    r"^rows\s+([\d,]+) published of ([\d,]+) .*?([\d,]+) dead letters", re.MULTILINE
)


# -- data ----------------------------------------------------------------------------------


def _records_with_offsets(path: Path) -> Iterator[tuple[list[str], int]]:
    """Yield ``(record, byte offset just after it)`` for every record, header included.

    Lines are read as bytes and decoded one by one, so the offset after the csv reader has
    returned a record is exactly the end of that record (quoted fields span lines).
    """
    consumed = 0

    def lines(fh: io.BufferedReader) -> Iterator[str]:
        nonlocal consumed
        first = True
        for raw in fh:
            consumed += len(raw)
            text = raw.decode("utf-8-sig" if first else "utf-8")
            first = False
            yield text

    csv.field_size_limit(64 * 1024 * 1024)
    with path.open("rb") as fh:
        for record in csv.reader(lines(fh)):
            yield record, consumed


def make_subset(source: Path, rows: int, dest: Path) -> int:
    """Write the header and the first ``rows`` records of ``source`` to ``dest``, byte-exact.

    Returns the number of data records written (fewer if the file is shorter).
    """
    end, written = 0, -1
    for _record, end in _records_with_offsets(source):  # noqa: B007 - read after the loop
        written += 1
        if written == rows:
            break
    with source.open("rb") as src, dest.open("wb") as out:
        out.write(src.read(end))
    return max(written, 0)


def read_rows(path: Path, limit: int) -> list[tuple[str, str]]:
    """Return ``(id, text)`` of the first ``limit`` records (header names ``id``, ``text``)."""
    rows: list[tuple[str, str]] = []
    header: list[str] | None = None
    for record, _ in _records_with_offsets(path):
        if header is None:
            header = record
            continue
        rows.append((record[header.index("id")], record[header.index("text")]))
        if len(rows) == limit:
            break
    return rows


def _write_records(dest: Path, records: Sequence[list[str]], newline: str = "\n") -> Path:
    buf = io.StringIO()
    csv.writer(buf, lineterminator=newline).writerows(records)
    dest.write_bytes(buf.getvalue().encode("utf-8"))
    return dest


def make_edits(source: Path, tmp: Path) -> list[tuple[str, Path, int, int]]:
    """The nightly edits of the whole file, each applied to the file before it, as
    ``(name, csv, inputs that should be charged, rows)``. Record terminators only change in the
    CRLF re-export (line breaks inside quoted texts stay LF, as spreadsheet exports do)."""
    records = [r for r, _ in _records_with_offsets(source)]
    header, rows = records[0], records[1:]
    text_at, id_at = header.index("text"), header.index("id")

    def new(row_id: str, text: str) -> list[str]:
        row = [""] * len(header)
        row[id_at], row[text_at] = row_id, text
        return row

    inserted = [new("zz-bench-new-first", "a brand new package inserted first"), *rows]
    edited = list(inserted)
    middle = len(edited) // 2
    edited[middle] = list(edited[middle])
    edited[middle][text_at] += " (edited tonight)"
    appended = [*edited, new("zz-bench-new-last", "a brand new package appended last")]
    shuffled = list(appended)
    random.Random(7).shuffle(shuffled)
    deleted = [r for i, r in enumerate(shuffled) if i % 10 != 3]
    steps = [
        ("insert-first", inserted, 1),
        ("edit-middle", edited, 1),
        ("append", appended, 1),
        ("shuffle", shuffled, 0),
        ("delete-10pct", deleted, 0),
    ]
    out = [
        (name, _write_records(tmp / f"edit-{name}.csv", [header, *body]), right, len(body))
        for name, body, right in steps
    ]
    crlf = _write_records(tmp / "edit-crlf.csv", [header, *deleted], newline="\r\n")
    out.append(("reexport-crlf", crlf, 0, len(deleted)))
    return out


def make_kept_column_edits(source: Path, tmp: Path, *, rows: int = 100) -> tuple[Path, int]:
    """The whole file with the ``title`` of ``rows`` evenly spaced records changed and every
    ``text`` as it was: a night whose only edits are to a kept column the text does not use.
    Returns ``(csv, rows in it)``."""
    records = [r for r, _ in _records_with_offsets(source)]
    header, body = records[0], [list(r) for r in records[1:]]
    title_at = header.index("title")
    for i in range(0, len(body), max(1, len(body) // rows))[:rows]:
        body[i][title_at] += " (retitled tonight)"
    return _write_records(tmp / "edit-titles.csv", [header, *body]), len(body)


def distinct_texts(source: Path) -> int:
    """Distinct non-empty (not whitespace-only) texts of the file."""
    records = _records_with_offsets(source)
    header = next(records)[0]
    at = header.index("text")
    return len({r[at] for r, _ in records if r[at].strip()})


# -- fake server ---------------------------------------------------------------------------


class FakeServer:
    """``python -m tests.support.fake_openai`` in its own process (not sharing our GIL)."""

    def __init__(self, python: str, env: dict[str, str], *, dims: int = DIMS) -> None:
        self.proc = subprocess.Popen(
            [python, "-m", "tests.support.fake_openai", "--port", "0", "--dims", str(dims)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"fake server did not start: {line!r} {err[-2000:]}")
        self.base_url = line.split(" ", 1)[1]
        self.peak_rss_mb: float | None = None

    def stop(self) -> dict[str, int]:
        """SIGTERM; return its final counters ``{"requests": .., "inputs": ..}``."""
        self.peak_rss_mb = _vm_hwm_mb(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        out, _err = self.proc.communicate(timeout=30)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        return dict(json.loads(lines[-1])) if lines else {"requests": -1, "inputs": -1}


# -- /proc sampling ------------------------------------------------------------------------


def _status_field_kb(pid: int, name: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _vm_hwm_mb(pid: int) -> float | None:
    kb = _status_field_kb(pid, "VmHWM")
    return None if kb is None else kb / 1024


def _descendants(root: int) -> list[int]:
    """Pids of every live descendant of ``root`` (from the ppid field of /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _maps_torch(pid: int) -> bool | None:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return any("/torch/" in line for line in fh)
    except OSError:
        return None


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (all cores), from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def running_prefect_server(home: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``prefect server start`` with ``PREFECT_HOME=home`` for the block: (its process,
    its API URL); killed with its process group (the server and its uvicorn child) after."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # tests.support: not part of the installed package
    from tests.support.prefect_server import start_prefect_server

    home.mkdir(exist_ok=True)
    print(
        "bench: starting a Prefect server for the running-server runs", file=sys.stderr, flush=True
    )
    server, url = start_prefect_server(home)
    try:
        yield server, url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process, seconds (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def wait_quiet(max_wait_s: float, *, cores: float = 0.25, window_s: float = 2.0) -> float:
    """Wait until the machine's busy CPU over ``window_s`` is below ``cores``; return seconds
    waited (at most ``max_wait_s``). This box is shared: other work skews every number."""
    started = time.monotonic()
    while time.monotonic() - started < max_wait_s:
        before = _machine_busy_s()
        time.sleep(window_s)
        if (_machine_busy_s() - before) / window_s < cores:
            break
    return time.monotonic() - started


class Sampler(threading.Thread):
    """Polls VmHWM of the CLI process (and of each descendant) until ``stop()``.

    VmHWM is the kernel's high-water mark of resident memory, so polling only misses growth
    in the last period before exit. Also notes whether any torch library is mapped.
    """

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kb = 0
        self.children: dict[int, dict[str, Any]] = {}
        self.torch_mapped = False
        self.cli_cpu_s = 0.0  # the CLI process's own utime + stime at the last poll
        self._halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            kb = _status_field_kb(self.pid, "VmHWM")
            if kb is not None:
                self.peak_kb = max(self.peak_kb, kb)
                self.cli_cpu_s = max(self.cli_cpu_s, _proc_cpu_s(self.pid))
            if n % _TREE_EVERY == 0:
                for child in _descendants(self.pid):
                    ckb = _status_field_kb(child, "VmHWM")
                    info = self.children.setdefault(
                        child, {"cmd": _cmdline(child)[:160], "peak_kb": 0}
                    )
                    if ckb is not None:
                        info["peak_kb"] = max(info["peak_kb"], ckb)
            if n % _MAPS_EVERY == 0 and not self.torch_mapped:
                self.torch_mapped = bool(_maps_torch(self.pid))
            n += 1
            self._halt.wait(_POLL_S)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


# -- one CLI run ---------------------------------------------------------------------------


@dataclass
class RunResult:
    """Everything measured for one CLI command. Times in seconds, memory in MiB."""

    name: str
    dataset: str
    rows_input: int
    exit_code: int = -1
    wall_s: float = 0.0
    cpu_s: float = 0.0  # user+sys of the CLI and its reaped children (wait4 rusage)
    cli_self_cpu_s: float | None = None  # the CLI process alone (last 50 ms poll before exit)
    startup_s: float | None = None  # process start -> "Beginning flow run" line arrives
    temp_server_s: float | None = None  # "Starting temporary server" -> "Beginning flow run"
    runner_start_s: float | None = None  # Dask: cluster start + worker warm-up (flow's log)
    shutdown_s: float | None = None  # flow's "Finished in state" line -> process exit
    flow_wall_s: float | None = None  # the flow summary's own "wall time"
    plan_s: float | None = None  # "Beginning flow run" -> "planned ..." (log clock)
    skip_s: float | None = None  # "planned ..." -> "K to embed" / "already complete"
    embed_phase_s: float | None = None  # "K to embed" line -> last "chunk N:" line (log clock)
    commit_s: float | None = None  # last chunk (or "to embed") -> "manifest committed"
    flow_close_s: float | None = None  # manifest line (or last step) -> flow "Finished in state"
    rows_embedded: int = 0  # sum of rows in "chunk N: R rows published" lines
    steady_rows_per_s: float | None = None  # rows_embedded / embed_phase_s
    completion_rows_per_s: float | None = None  # first -> last chunk completion, first excluded
    chunks_logged: int = 0
    chunks_to_embed: int | None = None
    chunks_skipped: int | None = None
    status: str | None = None
    rows_published: int | None = None
    rows_failed: int | None = None
    summary_requests: int | None = None  # from the CLI summary "api N requests"
    server_requests: int | None = None  # from the fake server's counters
    server_inputs: int | None = None
    peak_rss_cli_mb: float | None = None
    peak_rss_children_mb: float | None = None
    peak_rss_children_cmd: str | None = None
    rusage_maxrss_mb: float | None = None  # wait4: max over the CLI and its reaped children
    torch_mapped: bool = False
    prefect_home_fresh: bool = False
    other_cpu_s: float | None = None  # CPU used meanwhile by processes not in this benchmark
    fake_server_cpu_s: float | None = None  # CPU the fake OpenAI server used for this run
    quiet_wait_s: float = 0.0  # time spent waiting for a quiet machine before the run
    right_inputs: int | None = None  # edit scenarios: the inputs an ideal run is charged
    error_lines: list[str] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)
    stdout: str = ""


def _log_seconds(line: str) -> float | None:
    match = _LOG_LINE.match(line)
    if not match:
        return None
    h, m, s, ms = (int(match.group(i)) for i in range(1, 5))
    return h * 3600 + m * 60 + s + ms / 1000


def run_cli(
    name: str,
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Path,
    dataset: str,
    rows_input: int,
    log_path: Path,
    prefect_home_fresh: bool,
) -> RunResult:
    """Run one CLI command, sampling memory and timestamping stderr lines as they arrive."""
    result = RunResult(
        name=name, dataset=dataset, rows_input=rows_input, prefect_home_fresh=prefect_home_fresh
    )
    events: list[tuple[float, str]] = []
    out_chunks: list[str] = []
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        bufsize=1,
    )
    sampler = Sampler(proc.pid)
    sampler.start()

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            events.append((time.monotonic() - started, line.rstrip("\n")))

    def read_out() -> None:
        assert proc.stdout is not None
        out_chunks.append(proc.stdout.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_err, read_out)]
    for reader in readers:
        reader.start()
    _pid, status, usage = os.wait4(proc.pid, 0)
    result.wall_s = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen
    sampler.stop()
    for reader in readers:
        reader.join(timeout=30)
    result.exit_code = proc.returncode
    result.cpu_s = usage.ru_utime + usage.ru_stime
    result.cli_self_cpu_s = sampler.cli_cpu_s or None
    result.rusage_maxrss_mb = usage.ru_maxrss / 1024
    result.peak_rss_cli_mb = sampler.peak_kb / 1024 if sampler.peak_kb else None
    result.torch_mapped = sampler.torch_mapped
    if sampler.children:
        top = max(sampler.children.values(), key=lambda c: c["peak_kb"])
        result.peak_rss_children_mb = top["peak_kb"] / 1024
        result.peak_rss_children_cmd = top["cmd"]
    _reap_leftovers(sampler.children)
    result.stdout = "".join(out_chunks)
    log_path.write_text("\n".join(f"{t:9.3f} {line}" for t, line in events) + "\n")
    _parse_stderr(result, events)
    _parse_stdout(result)
    return result


def _reap_leftovers(children: dict[int, dict[str, Any]]) -> None:
    """Terminate descendants the CLI left running (same pid and command line), by pid."""
    deadline = time.monotonic() + 10
    for pid, info in children.items():
        while time.monotonic() < deadline and _cmdline(pid)[:160] == info["cmd"] and info["cmd"]:
            time.sleep(0.2)
        if _cmdline(pid)[:160] == info["cmd"] and info["cmd"]:
            print(
                f"bench: CLI left pid {pid} running ({info['cmd'][:80]}); terminating it",
                file=sys.stderr,
            )
            info["left_running"] = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _parse_stderr(result: RunResult, events: list[tuple[float, str]]) -> None:
    dispatch_at: float | None = None
    ready_at: float | None = None
    temp_server_at: float | None = None
    flow_done_at: float | None = None
    stamps: dict[str, float] = {}
    completions: list[tuple[float, int]] = []
    for arrived, line in events:
        stamp = _log_seconds(line)
        if "Starting temporary server" in line and temp_server_at is None:
            temp_server_at = arrived
        elif "Beginning flow run" in line and result.startup_s is None:
            result.startup_s = arrived
        elif (m := _DISPATCH.search(line)) and stamp is not None:
            dispatch_at = stamp
            result.chunks_skipped, _total, result.chunks_to_embed = map(int, m.groups())
        elif (m := _RUNNER_READY.search(line)) and stamp is not None:
            result.runner_start_s = float(m.group(1))
            ready_at = stamp  # Dask's start-up is reported apart: embedding starts here
        elif (m := _CHUNK.search(line)) and stamp is not None:
            completions.append((stamp, int(m.group(2))))
        elif "Flow run" in line and "Finished in state" in line:
            flow_done_at = arrived
        if stamp is not None:
            for mark, pattern in _PHASE_MARKS:
                if mark not in stamps and pattern.search(line):
                    stamps[mark] = stamp
        if " | ERROR " in line or line.startswith("Traceback") or " | CRITICAL " in line:
            result.error_lines.append(line[:300])
    result.stderr_tail = [line[:300] for _t, line in events[-15:]]
    if temp_server_at is not None and result.startup_s is not None:
        result.temp_server_s = result.startup_s - temp_server_at
    if flow_done_at is not None:
        result.shutdown_s = result.wall_s - flow_done_at
    if ready_at is not None and dispatch_at is not None:
        dispatch_at = max(dispatch_at, ready_at)
    result.chunks_logged = len(completions)
    result.rows_embedded = sum(rows for _t, rows in completions)
    if completions and dispatch_at is not None:
        last = max(t for t, _r in completions)
        result.embed_phase_s = _wrap(last - dispatch_at)
        if result.embed_phase_s > 0:
            result.steady_rows_per_s = result.rows_embedded / result.embed_phase_s
    last_chunk = max((t for t, _r in completions), default=None)
    _phases(result, stamps, dispatch_at, last_chunk)
    if len(completions) >= 2:
        completions.sort()
        span = _wrap(completions[-1][0] - completions[0][0])
        if span > 0:
            result.completion_rows_per_s = sum(r for _t, r in completions[1:]) / span


def _phases(
    result: RunResult, stamps: dict[str, float], dispatch_at: float | None, last_chunk: float | None
) -> None:
    """Durations between the flow's own log lines (its clock, millisecond resolution)."""

    def span(start: float | None, stop: float | None) -> float | None:
        return None if start is None or stop is None else round(_wrap(stop - start), 3)

    ready = dispatch_at if dispatch_at is not None else stamps.get("complete")
    result.plan_s = span(stamps.get("begin"), stamps.get("planned"))
    result.skip_s = span(stamps.get("planned"), ready)
    manifest = stamps.get("manifest")
    result.commit_s = span(last_chunk if last_chunk is not None else ready, manifest)
    result.flow_close_s = span(manifest if manifest is not None else ready, stamps.get("finished"))


def _wrap(seconds: float) -> float:
    return seconds + 86400 if seconds < -43200 else seconds  # a run across midnight


def _parse_stdout(result: RunResult) -> None:
    text = result.stdout
    if m := _SUMMARY_WALL.search(text):
        result.flow_wall_s = float(m.group(1))
    if m := _SUMMARY_API.search(text):
        result.summary_requests = int(m.group(1).replace(",", ""))
    if m := _SUMMARY_STATUS.search(text):
        result.status = m.group(1).rstrip(":")
    if m := _SUMMARY_ROWS.search(text):
        result.rows_published = int(m.group(1).replace(",", ""))
        result.rows_failed = int(m.group(3).replace(",", ""))


# -- baseline: the seeds' design ---------------------------------------------------------


def run_baseline(rows: list[tuple[str, str]], base_url: str, workdir: Path) -> dict[str, Any]:
    """One request per row; after every row, rewrite the JSON checkpoint of all finished ids.

    Kept deliberately as the seeds' design, with two favours to it: one keep-alive
    HTTP connection, and no fsync of the checkpoint (write a temp file, ``os.replace``).
    Empty texts are skipped, as embedline never sends them either.
    """
    import httpx
    import numpy as np

    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / "checkpoint.json"
    finished: list[str] = []
    vectors: list[Any] = []
    url = f"{base_url}/embeddings"
    started = time.perf_counter()
    with httpx.Client(timeout=60) as client:
        for row_id, text in rows:
            if not text.strip():
                continue
            response = client.post(
                url, json={"model": MODEL, "input": [text], "encoding_format": "base64"}
            )
            response.raise_for_status()
            encoded = response.json()["data"][0]["embedding"]
            vectors.append(np.frombuffer(base64.b64decode(encoded), dtype="<f4"))
            finished.append(row_id)
            tmp = checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps({"finished": finished}))
            os.replace(tmp, checkpoint)
    elapsed = time.perf_counter() - started
    np.save(workdir / "vectors.npy", np.stack(vectors))
    return {
        "rows": len(finished),
        "wall_s": elapsed,
        "rows_per_s": len(finished) / elapsed,
        "checkpoint_bytes": checkpoint.stat().st_size,
    }


# -- orchestration -------------------------------------------------------------------------


def _cli_env(args: argparse.Namespace, prefect_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PREFECT_HOME"] = str(prefect_home)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
    env.pop("PREFECT_PROFILES_PATH", None)
    if args.prefect_api_url:
        env["PREFECT_API_URL"] = args.prefect_api_url
    else:
        env.pop("PREFECT_API_URL", None)
    for name in ("EMBEDLINE_API_KEY", "OPENAI_API_KEY"):
        env.pop(name, None)  # loopback server needs no key; never send a real one
    return env


def _server_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


class Bench:
    """Holds the temp dir, environment and results of one benchmark run."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.prefect_home = tmp / "prefect-home"
        self.env = _cli_env(args, self.prefect_home)
        self.runs: list[RunResult] = []
        self.servers: list[dict[str, Any]] = []
        self.pairs: list[dict[str, Any]] = []  # SDK loop and embedline, running server

    def cli_argv(self, data: Path, output: Path, ledger: Path, base_url: str) -> list[str]:
        argv = [
            self.args.python,
            "-m",
            "cli",
            "run",
            str(data),
            "--embedder",
            "openai",
            "--base-url",
            base_url,
            "--output",
            str(output),
            "--ledger",
            str(ledger),
        ]
        if self.args.allow_failed_rows:
            argv.append("--allow-failed-rows")
        return argv + list(self.args.cli_arg or [])

    def measure(
        self,
        name: str,
        dataset: str,
        rows: int,
        data: Path,
        output: Path,
        ledger: Path,
        extra: Sequence[str] = (),
    ) -> RunResult:
        fresh_home = not self.prefect_home.exists() and not self.args.prefect_api_url
        server = FakeServer(self.args.python, _server_env(), dims=getattr(self.args, "dims", DIMS))
        try:
            argv = self.cli_argv(data, output, ledger, server.base_url) + list(extra)
            waited = wait_quiet(self.args.quiet_wait) if self.args.quiet_wait > 0 else 0.0
            print(f"bench: {name}: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
            busy0, server0, self0 = _machine_busy_s(), _proc_cpu_s(server.proc.pid), _self_cpu_s()
            result = run_cli(
                name,
                argv,
                env=self.env,
                cwd=self.tmp,
                dataset=dataset,
                rows_input=rows,
                log_path=self.tmp / f"{name}.stderr.log",
                prefect_home_fresh=fresh_home,
            )
            result.fake_server_cpu_s = _proc_cpu_s(server.proc.pid) - server0
            own = result.cpu_s + result.fake_server_cpu_s + _self_cpu_s() - self0
            result.other_cpu_s = max(0.0, _machine_busy_s() - busy0 - own)
            result.quiet_wait_s = waited
        finally:
            counters = server.stop()
        result.server_requests = counters.get("requests")
        result.server_inputs = counters.get("inputs")
        self.servers.append({"run": name, "peak_rss_mb": server.peak_rss_mb, **counters})
        self.runs.append(result)
        print(
            f"bench: {name}: exit {result.exit_code}, wall {result.wall_s:.1f} s, "
            f"{result.server_requests} requests",
            file=sys.stderr,
            flush=True,
        )
        if result.exit_code != 0:
            print("bench: stderr tail:\n  " + "\n  ".join(result.stderr_tail), file=sys.stderr)
        return result

    def baseline(self, data: Path) -> dict[str, Any] | None:
        if self.args.baseline_rows <= 0:
            return None
        rows = read_rows(data, self.args.baseline_rows)
        server = FakeServer(self.args.python, _server_env())
        print(f"bench: baseline (seed design) on {len(rows)} rows", file=sys.stderr, flush=True)
        try:
            waited = wait_quiet(self.args.quiet_wait) if self.args.quiet_wait > 0 else 0.0
            busy0, server0, self0 = _machine_busy_s(), _proc_cpu_s(server.proc.pid), _self_cpu_s()
            result = run_baseline(rows, server.base_url, self.tmp / "baseline")
            own = _proc_cpu_s(server.proc.pid) - server0 + _self_cpu_s() - self0
            result.update(
                other_cpu_s=max(0.0, _machine_busy_s() - busy0 - own), quiet_wait_s=waited
            )
        finally:
            counters = server.stop()
        result.update(server_requests=counters.get("requests"))
        print(f"bench: baseline: {result['rows_per_s']:.0f} rows/s", file=sys.stderr, flush=True)
        return result

    def sdk_baseline(self, data: Path) -> dict[str, Any]:
        """``benchmarks/sdk_loop.py`` (the openai SDK, 4 threads, batches of 1,000) on ``data``
        as its own process against a fresh fake server: wall time end to end."""
        server = FakeServer(self.args.python, _server_env())
        print("bench: openai-SDK loop on the whole file", file=sys.stderr, flush=True)
        try:
            children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            server0 = _proc_cpu_s(server.proc.pid)
            started = time.perf_counter()
            done = subprocess.run(
                [
                    self.args.python,
                    str(REPO / "benchmarks" / "sdk_loop.py"),
                    str(data),
                    server.base_url,
                    str(self.tmp / "sdk.parquet"),
                ],
                capture_output=True,
                text=True,
                env=_server_env(),
            )
            wall = time.perf_counter() - started
            children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            server_cpu = _proc_cpu_s(server.proc.pid) - server0
        finally:
            counters = server.stop()
        if done.returncode != 0:
            raise RuntimeError(f"sdk_loop.py failed: {done.stderr[-2000:]}")
        rows = int(done.stdout.split()[-1])
        print(f"bench: openai-SDK loop: {wall:.1f} s", file=sys.stderr, flush=True)
        cpu = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
        return {
            "rows": rows,
            "wall_s": wall,
            "server_requests": counters.get("requests"),
            "cpu_s": cpu,
            "fake_server_cpu_s": server_cpu,
        }

    def dask_runs(self, data: Path, rows: int) -> None:
        """The same subset with threads and with a local 2-worker Dask cluster (fresh output
        and ledger each)."""
        for runner in ("threads", "dask"):
            name = f"first{rows}-{runner}"
            extra = ["--task-runner", "dask", "--dask-workers", "2"] if runner == "dask" else []
            saved = self.args.cli_arg
            self.args.cli_arg = [*(saved or []), *extra]
            try:
                self.measure(
                    name,
                    f"first{rows}",
                    rows,
                    data,
                    self.tmp / f"{name}-out",
                    self.tmp / f"{name}-ledger.sqlite3",
                )
            finally:
                self.args.cli_arg = saved

    def dataset_runs(self, name: str, data: Path, rows: int, *, reruns: bool) -> None:
        out, ledger = self.tmp / f"{name}-out", self.tmp / f"{name}-ledger.sqlite3"
        self.measure(f"{name}", name, rows, data, out, ledger)
        if not reruns:
            return
        self.measure(f"{name}-rerun", name, rows, data, out, ledger)
        for manifest in (out / "manifests").glob("*.json"):
            manifest.unlink()
        self.measure(f"{name}-rerun-no-manifest", name, rows, data, out, ledger)
        for manifest in (out / "manifests").glob("*.json"):
            manifest.unlink()
        fresh = self.tmp / f"{name}-ledger-fresh.sqlite3"
        self.measure(f"{name}-rerun-fresh-ledger", name, rows, data, out, fresh)

    def running_server_run(self, name: str, data: Path, rows: int, pairs: int) -> None:
        """``pairs`` times, the SDK loop then the whole file again (fresh output and ledger)
        against a ``prefect server start`` that is already running: the deployment case, no
        temporary server to wait for. Alternating the two puts any drift of the machine's
        load on both sides of each ratio. The server is stopped (its process group killed)
        before this returns; each pair lands in ``self.pairs``."""
        saved = self.env
        with running_prefect_server(self.tmp / "prefect-server-home") as (_, url):
            self.env = {**saved, "PREFECT_API_URL": url}
            try:
                for pair in range(1, pairs + 1):
                    sdk = self.sdk_baseline(data)
                    run_name = f"{name}-running-server-{pair}"
                    run = self.measure(
                        run_name,
                        name,
                        rows,
                        data,
                        self.tmp / f"{run_name}-out",
                        self.tmp / f"{run_name}-ledger.sqlite3",
                    )
                    self.pairs.append(
                        {
                            "sdk_wall_s": sdk["wall_s"],
                            "run": run_name,
                            "embedline_wall_s": run.wall_s,
                            "exit_code": run.exit_code,
                            "ratio": sdk["wall_s"] / run.wall_s if run.wall_s else 0.0,
                        }
                    )
            finally:
                self.env = saved

    def kept_column_runs(self, name: str, data: Path, rows: int) -> None:
        """A first run keeping ``title`` beside the vectors (the text is ``text`` alone), then
        a night that edits 100 titles and nothing else: it should charge 0 inputs."""
        out, ledger = self.tmp / f"{name}-kept-out", self.tmp / f"{name}-kept-ledger.sqlite3"
        keep = ["--keep-columns", "title"]
        self.measure(f"{name}-keep-title", name, rows, data, out, ledger, keep)
        edited, edited_rows = make_kept_column_edits(data, self.tmp)
        night = self.measure(f"{name}-titles-only", name, edited_rows, edited, out, ledger, keep)
        night.right_inputs = 0

    def edit_runs(self, name: str, data: Path) -> None:
        """Nightly edits of the whole file on the output and ledger of its first run."""
        out, ledger = self.tmp / f"{name}-out", self.tmp / f"{name}-ledger.sqlite3"
        for edit, path, right, rows in make_edits(data, self.tmp):
            run = self.measure(f"{name}-{edit}", name, rows, path, out, ledger)
            run.right_inputs = right


def _ratios(runs: list[RunResult], baseline: dict[str, Any] | None) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    if not baseline:
        return ratios
    base = baseline["rows_per_s"]
    for run in runs:
        if run.rows_embedded and run.steady_rows_per_s:
            ratios[f"{run.name}: steady rows/s vs baseline"] = run.steady_rows_per_s / base
            ratios[f"{run.name}: end-to-end rows/s (incl. Prefect start-up) vs baseline"] = (
                run.rows_embedded / run.wall_s / base
            )
    return ratios


def _sdk_targets(
    full: RunResult | None, sdk: dict[str, Any] | None, pairs: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """With a running Prefect server (how deployments run), the whole
    file end to end at least as fast as the SDK loop: the median of the alternated pairs,
    each pair's ratio listed. With the CLI's temporary server, its start-up is reported
    apart (no target: it is the price of not running a server)."""
    targets: dict[str, Any] = {}
    if pairs:
        ratios = sorted(p["ratio"] for p in pairs)
        median = (
            ratios[len(ratios) // 2]
            if len(ratios) % 2
            else (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
        )
        each = ", ".join(f"{p['sdk_wall_s']:.1f}/{p['embedline_wall_s']:.1f} s" for p in pairs)
        targets[
            f"running Prefect server: whole file end to end >= {TARGET_SDK_RATIO}x the "
            f"openai-SDK loop (median of {len(pairs)} pairs, SDK/embedline: {each})"
        ] = {
            "value": round(median, 2),
            "each": [round(r, 2) for r in ratios],
            "met": median >= TARGET_SDK_RATIO and all(p["exit_code"] == 0 for p in pairs),
        }
    if full is not None and sdk is not None and full.wall_s:  # reported, no target
        start = full.temp_server_s or 0.0
        targets[
            f"temporary server: the SDK loop's wall time / embedline's (SDK "
            f"{sdk['wall_s']:.1f} s / embedline {full.wall_s:.1f} s, of which "
            f"{start:.1f} s the temporary server's start-up; without it "
            f"{sdk['wall_s'] / max(full.wall_s - start, 1e-9):.2f})"
        ] = {"value": round(sdk["wall_s"] / full.wall_s, 2), "met": None}  # no target
    return targets


def _targets(
    runs: list[RunResult],
    full_name: str,
    sdk: dict[str, Any] | None = None,
    dask_rows: int = 0,
    pairs: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    by = {r.name: r for r in runs}
    full = by.get(full_name)
    targets: dict[str, Any] = _sdk_targets(full, sdk, pairs)
    threads, dask = by.get(f"first{dask_rows}-threads"), by.get(f"first{dask_rows}-dask")
    if threads is not None and dask is not None:
        ratio = (dask.steady_rows_per_s or 0) / (threads.steady_rows_per_s or float("inf"))
        targets[
            f"dask (2 workers) steady rows/s >= {TARGET_DASK_RATIO}x threads on "
            f"{dask_rows:,} rows (start-up apart: threads {_fmt(threads.startup_s)} s, "
            f"dask {_fmt(dask.startup_s)} s)"
        ] = {
            "value": round(ratio, 2),
            "met": ratio >= TARGET_DASK_RATIO and dask.exit_code == 0 == threads.exit_code,
        }
    if full is not None:
        targets["steady_rows_per_s >= 5000 (whole file)"] = {
            "value": full.steady_rows_per_s,
            "met": (full.steady_rows_per_s or 0) >= TARGET_STEADY_ROWS_S,
        }
        targets["wall_s < 45 (whole file, incl. Prefect start-up)"] = {
            "value": full.wall_s,
            "met": full.wall_s < TARGET_FULL_WALL_S and full.exit_code == 0,
        }
    peaks = [r.peak_rss_cli_mb or 0 for r in runs]
    if peaks:
        targets["peak RSS of the CLI process < 500 MB (all runs)"] = {
            "value": max(peaks),
            "met": max(peaks) < TARGET_PEAK_RSS_MB,
        }
    targets["torch never mapped into the CLI process"] = {
        "value": any(r.torch_mapped for r in runs),
        "met": not any(r.torch_mapped for r in runs),
    }
    crlf, shuffle = by.get(full_name + "-reexport-crlf"), by.get(full_name + "-shuffle")
    rerun = by.get(full_name + "-rerun")
    if crlf is not None and rerun is not None and rerun.wall_s:
        targets[f"{crlf.name} wall time < 1.5x the unchanged-file rerun"] = {
            "value": round(crlf.wall_s / rerun.wall_s, 2),
            "met": crlf.wall_s / rerun.wall_s < 1.5,
        }
    if shuffle is not None and full is not None and full.wall_s:  # reported, no target
        targets[f"{shuffle.name} (every row looked up and copied) wall time / first run's"] = {
            "value": round(shuffle.wall_s / full.wall_s, 2),
            "met": True,
        }
    for edit in (r for r in runs if r.right_inputs is not None):
        targets[f"{edit.name}: inputs charged = {edit.right_inputs}"] = {
            "value": edit.server_inputs,
            "met": edit.server_inputs == edit.right_inputs,
        }
    for suffix in ("-rerun", "-rerun-no-manifest", "-rerun-fresh-ledger"):
        rerun = by.get(full_name + suffix)
        if rerun is not None:
            targets[f"{rerun.name}: wall_s < {TARGET_RERUN_WALL_S:.0f}, exit 0, zero requests"] = {
                "value": {
                    "wall_s": rerun.wall_s,
                    "exit_code": rerun.exit_code,
                    "requests": rerun.server_requests,
                },
                "met": rerun.wall_s < TARGET_RERUN_WALL_S
                and rerun.exit_code == 0
                and rerun.server_requests == 0,
            }
    return targets


def cpu_budget(runs: list[RunResult], full_name: str, sdk: dict[str, Any] | None) -> dict[str, Any]:
    """What the whole-file runs cost in CPU, and the best end-to-end ratio that cost allows.

    A command that needs C core-seconds on N cores cannot finish in under C / N seconds,
    however its work is overlapped; so ``sdk_wall_s / (C / N)`` bounds the ratio to the SDK
    loop that any scheduling (a head start, more threads, fewer waits) could reach without
    cutting CPU. C counts every process the command needs: the CLI, its children (the
    temporary Prefect server), the fake embedding server and, for the running-server run,
    the Prefect server (measured as the other processes' CPU, so noise counts too).
    Seconds; ``cores`` is ``os.sched_getaffinity``.
    """
    if sdk is None or "cpu_s" not in sdk:
        return {}
    cores = len(os.sched_getaffinity(0))
    budget: dict[str, Any] = {
        "cores": cores,
        "sdk_loop": {
            "wall_s": sdk["wall_s"],
            "cpu_s": sdk["cpu_s"],
            "fake_server_cpu_s": sdk["fake_server_cpu_s"],
            "total_cpu_s": sdk["cpu_s"] + sdk["fake_server_cpu_s"],
        },
    }
    by = {r.name: r for r in runs}
    for name, prefect_part in (
        (full_name, "temporary_server_cpu_s"),
        (f"{full_name}-running-server-1", "prefect_server_cpu_s"),
    ):
        run = by.get(name)
        if run is None or run.cli_self_cpu_s is None or run.fake_server_cpu_s is None:
            continue
        prefect = (
            run.cpu_s - run.cli_self_cpu_s
            if prefect_part == "temporary_server_cpu_s"
            else run.other_cpu_s or 0.0
        )
        total = run.cli_self_cpu_s + prefect + run.fake_server_cpu_s
        budget[name] = {
            "wall_s": run.wall_s,
            "cli_cpu_s": run.cli_self_cpu_s,
            prefect_part: prefect,
            "fake_server_cpu_s": run.fake_server_cpu_s,
            "total_cpu_s": total,
            "floor_wall_s": total / cores,
            "best_ratio": sdk["wall_s"] / (total / cores),
        }
    return budget


def print_cpu_budget(budget: dict[str, Any]) -> None:
    """One paragraph per whole-file run: its CPU, and the ratio bound it implies."""
    if not budget:
        return
    sdk, cores = budget["sdk_loop"], budget["cores"]
    print(
        f"\ncpu budget on {cores} cores (core-seconds): the SDK loop {sdk['total_cpu_s']:.1f} "
        f"(loop {sdk['cpu_s']:.1f}, fake server {sdk['fake_server_cpu_s']:.1f}) in "
        f"{sdk['wall_s']:.1f} s"
    )
    for name, b in budget.items():
        if name in ("sdk_loop", "cores"):
            continue
        prefect = b.get("temporary_server_cpu_s", b.get("prefect_server_cpu_s"))
        which = (
            "temporary Prefect server"
            if "temporary_server_cpu_s" in b
            else "running Prefect server and other processes"
        )
        print(
            f"  {name}: {b['total_cpu_s']:.1f} (CLI {b['cli_cpu_s']:.1f}, {which} "
            f"{prefect:.1f}, fake server {b['fake_server_cpu_s']:.1f}) in {b['wall_s']:.1f} s: "
            f"no scheduling finishes under {b['floor_wall_s']:.1f} s, so the end-to-end "
            f"ratio is at most {b['best_ratio']:.2f} without cutting CPU"
        )


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(
    runs: list[RunResult],
    baseline: dict[str, Any] | None,
    ratios: dict[str, Any],
    targets: dict[str, Any],
) -> None:
    head = (
        "run",
        "exit",
        "rows",
        "wall s",
        "start s",
        "embed s",
        "rows/s",
        "req",
        "RSS cli",
        "RSS child",
        "shut s",
        "other cores",
    )
    lines = [head]
    for r in runs:
        lines.append(
            (
                r.name,
                str(r.exit_code),
                f"{r.rows_embedded:,}/{r.rows_input:,}",
                _fmt(r.wall_s),
                _fmt(r.startup_s),
                _fmt(r.embed_phase_s, ".2f"),
                _fmt(r.steady_rows_per_s, ",.0f"),
                str(r.server_requests),
                _fmt(r.peak_rss_cli_mb, ".0f"),
                _fmt(r.peak_rss_children_mb, ".0f"),
                _fmt(r.shutdown_s),
                _fmt(None if r.other_cpu_s is None else r.other_cpu_s / r.wall_s, ".2f"),
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    print()
    for row in lines:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print("\nphases (flow log clock, s): plan / skip-published / embed / manifest / flow close")
    for r in runs:
        print(
            f"  {r.name}: {_fmt(r.plan_s, '.2f')} / {_fmt(r.skip_s, '.2f')} / "
            f"{_fmt(r.embed_phase_s, '.2f')} / {_fmt(r.commit_s, '.2f')} / "
            f"{_fmt(r.flow_close_s, '.2f')}; temporary server start {_fmt(r.temp_server_s)}"
            f"{' (fresh PREFECT_HOME)' if r.prefect_home_fresh else ''}"
            + (
                f"; dask cluster start + warm-up {r.runner_start_s:.1f}"
                if r.runner_start_s is not None
                else ""
            )
        )
    if baseline:
        print(
            f"\nbaseline (seed design, {baseline['rows']:,} rows): {baseline['rows_per_s']:,.0f} "
            f"rows/s, {baseline['wall_s']:.1f} s, {baseline['server_requests']} requests, other "
            f"processes {baseline['other_cpu_s'] / baseline['wall_s']:.2f} cores"
        )
    for key, value in ratios.items():
        print(f"ratio  {key}: {value:,.1f}x")
    noisy = [r.name for r in runs if (r.other_cpu_s or 0) / r.wall_s > 0.25]
    if baseline and baseline["other_cpu_s"] / baseline["wall_s"] > 0.25:
        noisy.insert(0, "baseline")
    if noisy:
        print(
            f"WARNING: other processes used > 0.25 cores during {', '.join(noisy)}: those "
            "numbers are skewed; rerun on a quiet machine (or with --quiet-wait 120)"
        )
    edits = [r for r in runs if r.right_inputs is not None]
    if edits:
        print("\nnightly edits of the whole file (same output and ledger, in this order):")
        print("  edit                 inputs charged  right number  wall s  exit")
        for r in edits:
            print(
                f"  {r.name:<20} {r.server_inputs!s:>14}  {r.right_inputs:>12}  "
                f"{r.wall_s:>6.1f}  {r.exit_code:>4}"
            )
    for key, value in targets.items():
        verdict = "REPORT" if value["met"] is None else "MET   " if value["met"] else "MISSED"
        print(f"target {verdict} {key}: {value['value']}")


def _machine() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "prefect": version("prefect"),
        "httpx": version("httpx"),
        "pyarrow": version("pyarrow"),
        "load_avg_at_start": os.getloadavg(),
        **_git(),
    }


def _git() -> dict[str, Any]:
    """The code measured: HEAD and whether the work tree differs (read-only git commands)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_head": git("rev-parse", "HEAD"),
        "git_modified_files": None if status is None else len(status.splitlines()),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="input CSV (default: the English Debian file vendored in tests/data, 63,905 rows)",
    )
    parser.add_argument(
        "--rows-subset", type=int, default=10_000, help="records in the subset run (0 skips it)"
    )
    parser.add_argument(
        "--baseline-rows",
        type=int,
        default=2_000,
        help="rows for the seed-design baseline (0 skips it)",
    )
    parser.add_argument(
        "--dask-rows",
        type=int,
        default=20_000,
        help="rows for the threads-vs-Dask comparison (0 skips it)",
    )
    parser.add_argument(
        "--no-full", action="store_true", help="skip the whole-file run and its reruns"
    )
    parser.add_argument(
        "--no-edits", action="store_true", help="skip the nightly edit scenarios on the whole file"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="SDK loop / whole-file run pairs against a running `prefect "
        "server start`, alternated (0 skips them)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default benchmarks/results/cli-<UTC time>.json)",
    )
    parser.add_argument(
        "--prefect-api-url",
        default=None,
        help="reuse a running Prefect server instead of a temporary one",
    )
    parser.add_argument(
        "--no-allow-failed-rows",
        dest="allow_failed_rows",
        action="store_false",
        help="do not pass --allow-failed-rows (the whole file holds 3 dead "
        "letters: 1 empty text, 2 too long; the run then exits 1)",
    )
    parser.add_argument(
        "--cli-arg",
        action="append",
        metavar="ARG",
        help="extra argument for `embedline run`, repeatable (e.g. --cli-arg=--chunk-size=2000)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to SECONDS for the machine to be idle "
        "(< 0.25 busy cores over 2 s)",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for the CLI and the fake server"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, outputs)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    data = (args.data or default_data()).resolve()
    if not data.is_file():
        print(
            f"bench_cli: error: input CSV not found: {data}\n"
            "  pass --data PATH (the default is the file vendored in tests/data)",
            file=sys.stderr,
        )
        return 2
    if not Path("/proc/self/status").exists():
        print("bench_cli: error: needs Linux /proc for memory sampling", file=sys.stderr)
        return 2
    started_at = dt.datetime.now(dt.UTC)
    out = args.out or REPO / "benchmarks" / "results" / f"cli-{started_at:%Y%m%dT%H%M%SZ}.json"
    tmp = Path(tempfile.mkdtemp(prefix="embedline-bench-"))
    machine = _machine()
    bench = Bench(args, tmp)
    try:
        print(f"bench: temp dir {tmp}; counting records of {data}", file=sys.stderr, flush=True)
        total_rows = sum(1 for _ in _records_with_offsets(data)) - 1
        baseline = bench.baseline(data)
        sdk = None if args.no_full else bench.sdk_baseline(data)
        if args.dask_rows > 0:
            dask_subset = tmp / f"{data.stem}-first{args.dask_rows}.csv"
            bench.dask_runs(dask_subset, make_subset(data, args.dask_rows, dask_subset))
        if args.rows_subset > 0:
            subset = tmp / f"{data.stem}-first{args.rows_subset}.csv"
            n = make_subset(data, args.rows_subset, subset)
            bench.dataset_runs(f"first{n}", subset, n, reruns=False)
        full_name = "full"
        if not args.no_full:
            full = tmp / data.name
            shutil.copyfile(data, full)  # the CLI reads a private copy
            bench.dataset_runs(full_name, full, total_rows, reruns=True)
            if args.pairs > 0 and not args.prefect_api_url:
                bench.running_server_run(full_name, full, total_rows, args.pairs)
            if not args.no_edits:
                bench.edit_runs(full_name, full)
                bench.kept_column_runs(full_name, full, total_rows)
            bench.runs[[r.name for r in bench.runs].index(full_name)].right_inputs = distinct_texts(
                full
            )  # one run charges each distinct non-empty text once
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    ratios = _ratios(bench.runs, baseline)
    targets = _targets(bench.runs, full_name, sdk, args.dask_rows, bench.pairs)
    print_table(bench.runs, baseline, ratios, targets)
    budget = cpu_budget(bench.runs, full_name, sdk)
    print_cpu_budget(budget)
    results = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**machine, "load_avg_at_end": os.getloadavg()},
        "data": {"path": str(data), "rows": total_rows, "bytes": data.stat().st_size},
        "settings": {
            "dims": DIMS,
            "model": MODEL,
            "encoding_format": "base64",
            "allow_failed_rows": args.allow_failed_rows,
            "cli_args": args.cli_arg,
            "prefect_api_url": args.prefect_api_url,
            "temp_dir": str(tmp) if args.keep else None,
        },
        "baseline": baseline,
        "sdk_loop": sdk,
        "sdk_pairs_running_server": bench.pairs,
        "runs": [asdict(r) for r in bench.runs],
        "fake_servers": bench.servers,
        "ratios": ratios,
        "cpu_budget": budget,
        "targets": targets,
        "benchmark_self_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
