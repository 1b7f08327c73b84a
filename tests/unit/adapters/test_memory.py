"""The allocator settings (``adapters.memory``): buffers of a few MiB made and freed by
several threads at once (the chunk tasks') are mapped and unmapped, so they cannot fragment
the heap and hold its memory; planning's, one thread and one block at a time, are reused
from the heap, not mapped, faulted in page by page and unmapped each time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

_FAULTS = """
import resource, sys
sys.path.insert(0, sys.argv[1])
from adapters.memory import keep_memory_flat, large_buffers_reused
if sys.argv[2] == "settings":
    keep_memory_flat()

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

with large_buffers_reused():
    for _ in range(5):
        buffer = bytearray(3 << 20)  # zero-filled: every page is touched
        del buffer
    before = faults()
    for _ in range(100):
        buffer = bytearray(3 << 20)
        del buffer
print(faults() - before)
"""

_FRAGMENTS = """
import random, sys, threading
sys.path.insert(0, sys.argv[1])
from adapters.memory import keep_memory_flat
keep_memory_flat()

def anon_mib():
    with open("/proc/self/status") as status:
        line = next(l for l in status if l.startswith("RssAnon"))
    return int(line.split()[1]) >> 10

kept = []
def chunk_task(seed):  # each step: buffers of 1-3 MiB, freed; one small object kept
    draw = random.Random(seed)
    for _ in range(400):
        buffers = [bytearray(draw.randint(1 << 20, 3 << 20)) for _ in range(3)]
        kept.append(bytearray(draw.randint(100, 20000)))
        del buffers

before = anon_mib()
threads = [threading.Thread(target=chunk_task, args=(seed,)) for seed in range(3)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(anon_mib() - before, sum(map(len, kept)) >> 20)
"""


def _run(script: str, *args: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | extra
    return subprocess.run(
        [sys.executable, "-c", script, str(REPO), *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_planning_buffers_of_a_few_mib_are_reused_not_faulted_in_again_each_time() -> None:
    pages = (3 << 20) // os.sysconf("SC_PAGE_SIZE")
    # 100 buffers of 3 MiB: mapped each time, that is 100 x 768 page faults; reused, a few
    assert int(_run(_FAULTS, "settings")) < pages * 100 // 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_chunk_tasks_buffers_do_not_fragment_the_heap() -> None:
    """Three threads, 1,200 steps of 1-3 MiB buffers and a small object kept each step: the
    process holds what it kept, not the heap's holes (measured: +11 MiB for 11 MiB kept; at
    a 4 MiB threshold, +42 MiB; the 10M-row edited night peaked at 475 MB instead of 344)."""
    grown, kept = map(int, _run(_FRAGMENTS).split())
    assert grown <= kept + 8, f"RSS grew {grown} MiB for {kept} MiB kept"


_POOL = """
import sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "cli":  # what the console script does: entry() sets _entered, then main()
    import cli
    cli._entered = True
    try:
        cli.main(["status", "--ledger", sys.argv[3]])
    except SystemExit:
        pass
else:  # a deployment's process: Prefect loads the flow from the flows package
    import flows.embed_csv
import pyarrow as pa
import tasks.load.read_run
tasks.load.read_run.read_embeddings_arrow
print(pa.default_memory_pool().backend_name, pa.array([1.0]).nbytes)
"""


@pytest.mark.parametrize("entry", ["cli", "flows"])
def test_every_entry_point_gets_the_system_pool_before_pyarrow_allocates(
    tmp_path: Path, entry: str
) -> None:
    """Arrow reads ARROW_DEFAULT_MEMORY_POOL once; a CLI that imported its commands first
    (the adapters package loading pyarrow) got mimalloc: peak RSS 481 MB instead of 327 at
    1M rows (bench_reuse)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MALLOC_") and k != "ARROW_DEFAULT_MEMORY_POOL"
    }
    out = subprocess.run(
        [sys.executable, "-c", _POOL, str(REPO), entry, str(tmp_path / "ledger.sqlite3")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.split()[0] == "system", out.stdout + out.stderr
