"""Progress when stderr is not a terminal: a line every N seconds that moves per batch (not
per chunk), with rows, rows/s and an ETA."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

_LINE = re.compile(r"^embedline: progress ([\d,]+) of 400 rows \([\d.]+%\), (\d) of 2 chunks, "
                   r"[\d,]+ rows/s, ETA (?:[\d,]+ s|-)$")  # fmt: skip


def test_progress_lines_move_per_batch(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> None:
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t{i}\n" for i in range(400)))
    fake_openai.fail_when(lambda payload: {"delay_s": 0.25})
    result = run_cli("run", "in.csv", "--embedder", "openai", "--base-url", fake_openai.base_url,
                     "--chunk-size", "200", "--batch-size", "20", "--concurrency", "1",
                     "--progress-interval", "0.5", "--output", "out", "--ledger", "l.sqlite3",
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [m for m in map(_LINE.match, result.stderr.splitlines()) if m]
    assert len(lines) >= 3, result.stderr[-3000:]
    rows = [int(m.group(1).replace(",", "")) for m in lines]
    assert rows == sorted(rows)
    assert any(r % 200 for r in rows), rows  # between chunk boundaries: batches counted
    assert any(r > 0 and m.group(2) == "0" for r, m in zip(rows, lines, strict=True)), rows
