"""Progress when stderr is not a terminal: a line every N seconds that moves per batch (not
per chunk), with rows, rows/s and an ETA."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

_LINE = re.compile(
    r"^embedline: progress ([\d,]+) of 400 rows \([\d.]+%\), (\d) of 2 chunks, "
    r"[\d,]+ rows/s, ETA (?:[\d,]+ s|-)$"
)


def test_progress_lines_move_per_batch(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> None:
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t{i}\n" for i in range(400)))
    fake_openai.fail_when(lambda payload: {"delay_s": 0.25})
    result = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--chunk-size",
        "200",
        "--batch-size",
        "20",
        "--concurrency",
        "1",
        "--progress-interval",
        "0.5",
        "--output",
        "out",
        "--ledger",
        "l.sqlite3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [m for m in map(_LINE.match, result.stderr.splitlines()) if m]
    assert len(lines) >= 3, result.stderr[-3000:]
    rows = [int(m.group(1).replace(",", "")) for m in lines]
    assert rows == sorted(rows)
    assert any(r % 200 for r in rows), rows  # between chunk boundaries: batches counted
    assert any(r > 0 and m.group(2) == "0" for r, m in zip(rows, lines, strict=True)), rows


def test_progress_never_goes_backwards_when_a_chunk_fails_and_is_retried(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """Chunk 0 embeds 5 batches, then a request fails for good (503, one attempt): Prefect
    retries the chunk once, which fails at the same batch. Its embedded rows were counted
    per batch; before, each restart and the failure took them back off the count (a line
    said fewer rows than the one before)."""
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t{i}\n" for i in range(400)))

    def fault(payload: dict) -> dict:
        if "t100" in payload["input"]:
            return {"status": 503}
        return {"delay_s": 0.25 if "t1" not in payload["input"][0] else 0.1}

    fake_openai.fail_when(fault)
    result = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--chunk-size",
        "200",
        "--batch-size",
        "20",
        "--concurrency",
        "1",
        "--max-attempts",
        "1",
        "--chunk-retries",
        "1",
        "--chunk-retry-delay",
        "0",
        "--progress-interval",
        "0.3",
        "--output",
        "out",
        "--ledger",
        "l.sqlite3",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [m for m in map(_LINE.match, result.stderr.splitlines()) if m]
    rows = [int(m.group(1).replace(",", "")) for m in lines]
    assert len(rows) >= 5 and any(0 < r < 200 for r in rows), result.stderr[-3000:]
    assert rows == sorted(rows), rows


def test_with_the_local_model_progress_moves_per_forward_pass(tmp_path: Path) -> None:
    """The local model takes a chunk's texts in one call; counted per call, the bar sat
    still for a whole chunk (a break test saw 10 distinct counts in a 208 s run)."""
    words = [
        "package",
        "provides",
        "library",
        "tools",
        "for",
        "the",
        "system",
        "and",
        "its",
        "users",
    ]
    text = " ".join(words[i % len(words)] for i in range(120))
    (tmp_path / "in.csv").write_text(
        "id,text\n" + "".join(f"r{i},{i} {text}\n" for i in range(240))
    )
    result = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "local",
        "--chunk-size",
        "240",
        "--progress-interval",
        "0.1",
        "--output",
        "out",
        "--ledger",
        "l.sqlite3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = re.compile(r"^embedline: progress ([\d,]+) of 240 rows ")
    rows = [
        int(m.group(1).replace(",", "")) for m in map(line.match, result.stderr.splitlines()) if m
    ]
    assert any(0 < r < 240 for r in rows), result.stderr[-3000:]
    assert rows == sorted(rows), rows


# -- on a terminal: log lines above the bar, never glued onto it --------------------------------

_CSI = re.compile(r"\x1b\[([?\d;]*)([A-Za-z])")
_LOG_AT_START = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \| (INFO|WARNING) ")


def _screen(stream: str, width: int) -> list[str]:
    """What a terminal shows after ``stream``: enough of a VT100 for Rich's live display
    (CR, LF, cursor up ``CSI n A``, erase line ``CSI n K``; colours and modes ignored)."""
    lines: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(stream):
        if (m := _CSI.match(stream, i)) is not None:
            params, final = m.groups()
            if final == "A":
                row = max(0, row - int(params or 1))
            elif final == "K":
                lines[row] = lines[row][:col] if params in ("", "0") else []
            i = m.end()
            continue
        char = stream[i]
        i += 1
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
            lines.extend([] for _ in range(row + 1 - len(lines)))
        elif char >= " ":
            line = lines[row]
            line.extend(" " for _ in range(col + 1 - len(line)))
            line[col] = char
            col = min(col + 1, width - 1)
    return ["".join(line).rstrip() for line in lines]


def test_on_a_terminal_log_lines_print_above_the_bar(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    import fcntl
    import os
    import struct
    import subprocess
    import sys
    import termios

    from tests.support.fixtures import REPO

    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},t{i}\n" for i in range(400)))
    fake_openai.fail_when(lambda payload: {"delay_s": 0.2})
    width = 200
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, width, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "COLUMNS": str(width)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "run",
            "in.csv",
            "--embedder",
            "openai",
            "--base-url",
            fake_openai.base_url,
            "--chunk-size",
            "100",
            "--batch-size",
            "20",
            "--concurrency",
            "2",
            "--output",
            "out",
            "--ledger",
            "l.sqlite3",
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    screen = _screen(b"".join(chunks).decode("utf-8", "replace"), width)
    logs = [line for line in screen if " | INFO " in line or " | WARNING " in line]
    bars = [line for line in screen if line.startswith("embedding")]
    assert len(logs) >= 4, screen  # chunk lines, published, manifest…
    assert all(_LOG_AT_START.match(line) for line in logs), logs  # none glued after the bar
    assert not any("embedding" in line for line in logs)
    assert len(bars) == 1 and "400/400" in bars[0], screen  # one bar, below, finished
    assert screen.index(bars[0]) > screen.index(logs[0])
