"""Every code path that reads CSV sets its own field limit (issue 8, item 9): a chunk task in a
fresh interpreter (as a Dask worker runs it) reads a text longer than csv's default 131,072
characters that planning accepted."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from adapters.csv_source import plan_csv

REPO = Path(__file__).resolve().parents[3]

_CHILD = """
import pickle, sys
from adapters.csv_chunks import read_chunk
source, spec = pickle.loads(sys.stdin.buffer.read())
rows = read_chunk(source, spec)
print(len(rows), len(rows[0].text))
"""


def test_read_chunk_in_a_fresh_interpreter_reads_a_field_over_131072_chars(tmp_path: Path) -> None:
    long_text = "x" * 200_000
    path = tmp_path / "long.csv"
    path.write_text(f'id,text\na,"{long_text}"\nb,short\n', encoding="utf-8")
    plan = plan_csv(
        path,
        id_column="id",
        text_column="text",
        codec="utf-8",
        chunk_size=10,
        model="m",
        dimensions=None,
    )
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=pickle.dumps((plan.source, plan.chunks[0])),
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr.decode()[-500:]
    assert child.stdout.decode().split() == ["2", "200000"]
