"""Issue 22 item 9: a write meets a full filesystem mid-run, for real (a 2 MiB tmpfs that a
filler fills while the run is embedding): the ledger's and the output's. ``embedline run``
prints one line naming the path, no traceback, exits 1; after the space is freed the same
command completes without embedding again any chunk already published (the fake server's
requests counted), and every vector is the server's deterministic one."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.output import read_local_output
from tests.support.tmpfs import fill

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

ROWS = [(f"r{i:02d}", f"disk full row {i}") for i in range(24)]
CHUNKS = 6  # --chunk-size 4, one request each (--batch-size 128)


def _input(tmp_path: Path) -> Path:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([("id", "text"), *ROWS])
    path = tmp_path / "in.csv"
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _run(
    tmp_path: Path, server: FakeEmbeddingServer, output: Path, ledger: Path, *extra: str
) -> tuple[int, str]:
    result = run_cli(
        "run",
        str(_input(tmp_path)),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        str(output),
        "--ledger",
        str(ledger),
        "--chunk-size",
        "4",
        "--concurrency",
        "1",
        *extra,
        cwd=tmp_path,
    )
    return result.returncode, result.stdout + result.stderr


def _fill_after(server: FakeEmbeddingServer, mount: Path, requests: int) -> list[Path]:
    """Fill ``mount`` while the run's ``requests``-th embedding request is answered."""
    filled: list[Path] = []

    def hook(payload: object) -> None:
        if server.requests >= requests and not filled:
            filled.append(fill(mount))
        return None

    server.fail_when(hook)
    return filled


@pytest.mark.parametrize("full", ["ledger", "output"])
def test_a_full_filesystem_mid_run_is_one_line_and_the_rerun_pays_nothing_twice(
    tmp_path: Path, tiny_tmpfs: Path, fake_openai: FakeEmbeddingServer, full: str
) -> None:
    output = tiny_tmpfs / "out" if full == "output" else tmp_path / "out"
    ledger = tiny_tmpfs / "ledger.sqlite3" if full == "ledger" else tmp_path / "ledger.sqlite3"
    filled = _fill_after(fake_openai, tiny_tmpfs, requests=3)
    code, out = _run(tmp_path, fake_openai, output, ledger)
    assert filled, out
    assert code == 1, out
    assert "Traceback" not in out and "OperationalError" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("embedline: error:")]
    assert len(errors) == 1, out
    assert f"is full: free space on {tiny_tmpfs} and rerun the same command" in errors[0], out
    assert str(ledger if full == "ledger" else output) in errors[0], out
    first = fake_openai.requests
    published = len([p for p in output.rglob("*.parquet") if not p.name.startswith(".")])
    assert 0 < published < CHUNKS, out
    if full == "ledger":  # every chunk paid for was published before the ledger filled
        assert published == first
        # the summary counts from the store and the process's tally, not from the ledger
        assert f"chunks     {published} published now" in out, out
        assert f"api        {first} requests" in out, out
    fake_openai.fail_when(None)
    filled[0].unlink()
    code, out = _run(tmp_path, fake_openai, output, ledger)
    assert code == 0, out
    assert fake_openai.requests - first == CHUNKS - published  # nothing published is paid again
    _, vectors = read_local_output(output)
    assert set(vectors) == {i for i, _ in ROWS}
    for row_id, text in ROWS:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), atol=1e-6)


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_a_full_lancedb_sink_directory_is_one_line_and_the_rerun_only_loads(
    tmp_path: Path, tiny_tmpfs: Path, fake_openai: FakeEmbeddingServer
) -> None:
    sink = tiny_tmpfs / "lancedb"
    filled = _fill_after(fake_openai, tiny_tmpfs, requests=CHUNKS)  # full before the load
    args = ("--sink", f"lancedb://{sink}")
    code, out = _run(tmp_path, fake_openai, tmp_path / "out", tmp_path / "l.sqlite3", *args)
    assert filled and code == 1, out
    assert "Traceback" not in out and "LanceError" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("embedline: error:")]
    assert len(errors) == 1, out
    assert f"{sink} is full: free space on {tiny_tmpfs} and rerun the same command" in errors[0]
    fake_openai.fail_when(None)
    filled[0].unlink()
    code, out = _run(tmp_path, fake_openai, tmp_path / "out", tmp_path / "l.sqlite3", *args)
    assert code == 0, out
    assert fake_openai.requests == CHUNKS  # the committed run is loaded, not embedded again
    import lancedb

    table = lancedb.connect(str(sink)).open_table("embeddings")
    assert sorted(table.to_arrow().column("id").to_pylist()) == [i for i, _ in ROWS]
