"""The allocator settings (``adapters.memory``): a run's working buffers of a few MiB (a
planning block, a chunk's Parquet body, a request's answer) are reused from the heap, not
mapped, faulted in page by page and unmapped each time."""

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
if sys.argv[2] == "settings":
    from adapters.memory import keep_memory_flat
    keep_memory_flat()

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

for _ in range(5):
    buffer = bytearray(3 << 20)  # zero-filled: every page is touched
    del buffer
before = faults()
for _ in range(100):
    buffer = bytearray(3 << 20)
    del buffer
print(faults() - before)
"""


def _page_faults(settings: bool, **extra: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | extra
    out = subprocess.run([sys.executable, "-c", _FAULTS, str(REPO),
                          "settings" if settings else "defaults"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_buffers_of_a_few_mib_are_reused_not_faulted_in_again_each_time() -> None:
    pages = (3 << 20) // os.sysconf("SC_PAGE_SIZE")
    # 100 buffers of 3 MiB: mapped each time, that is 100 x 768 page faults; reused, a few
    assert _page_faults(settings=True) < pages * 100 // 20


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
import tasks.read
tasks.read.read_embeddings_arrow
print(pa.default_memory_pool().backend_name, pa.array([1.0]).nbytes)
"""


@pytest.mark.parametrize("entry", ["cli", "flows"])
def test_every_entry_point_gets_the_system_pool_before_pyarrow_allocates(
    tmp_path: Path, entry: str
) -> None:
    """Arrow reads ARROW_DEFAULT_MEMORY_POOL once; a CLI that imported its commands first
    (the adapters package loading pyarrow) got mimalloc: peak RSS 481 MB instead of 327 at
    1M rows (bench_reuse)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", _POOL, str(REPO), entry,
                          str(tmp_path / "ledger.sqlite3")],
                         env=env, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split()[0] == "system", out.stdout + out.stderr
