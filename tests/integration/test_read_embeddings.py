"""Reading a committed run back: exactly the manifest's chunks, latest run by default, S3 too,
and the guide's pandas / polars / DuckDB examples (docs/guide/reading.md), executed as written."""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import embedline
from tests.support.csv_data import edit_rows, expected_vectors, read_rows, write_rows
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli
from tests.support.in_process import run_in_process
from tests.support.moto_server import moto_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

SAMPLE = REPO / "examples" / "debian-sample.csv"


def _run(
    cwd: Path,
    server: FakeEmbeddingServer,
    csv_path: Path,
    output: str,
    env: dict[str, str] | None = None,
) -> str:
    result = run_cli(
        "run",
        str(csv_path),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        output,
        "--ledger",
        str(cwd / "ledger.sqlite3"),
        "--chunk-size",
        "50",
        cwd=cwd,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return re.search(r"^run +([0-9a-f]{64})", result.stdout, re.M).group(1)


@pytest.fixture(scope="module")
def two_runs(
    tmp_path_factory: pytest.TempPathFactory, prefect_api_url: str
) -> Iterator[tuple[Path, dict]]:
    """The sample, then an edited copy, into one output root: (cwd, {name: (key, rows)}).
    Runs in process: what is read back is under test here, not the CLI."""
    cwd = tmp_path_factory.mktemp("read")
    rows = read_rows(SAMPLE)
    edited = edit_rows(rows, removed=20, changed=5, added=3)
    keys = []
    with FakeEmbeddingServer() as server:
        for name, these in (("first.csv", rows), ("second.csv", edited)):
            keys.append(
                run_in_process(
                    prefect_api_url,
                    input=str(write_rows(cwd / name, these)),
                    embedder="openai",
                    base_url=server.base_url,
                    output=str(cwd / "embedline-output"),
                    ledger=str(cwd / "ledger.sqlite3"),
                    chunk_size=50,
                )["run_key"]
            )
    yield cwd, {"first": (keys[0], rows), "second": (keys[1], edited)}


def _assert_frame(frame, rows: list[tuple[str, str]], *, delta: bool = False) -> None:
    """A full night reads back in input order; a delta night in manifest order (its own
    objects, then those it inherits): the same rows."""
    want = expected_vectors(rows)
    ids = [i for i, t in rows if t.strip()]
    assert (sorted(frame["id"]) == sorted(ids)) if delta else (frame["id"].tolist() == ids)
    assert frame["id"].is_unique
    for row_id, vector in zip(frame["id"], frame["embedding"], strict=True):
        assert vector.dtype == np.float32 and vector.shape == (384,)
        assert np.array_equal(vector, want[row_id])


def test_latest_run_by_default_and_an_earlier_run_by_key_prefix(two_runs) -> None:
    cwd, runs = two_runs
    latest = embedline.read_embeddings(str(cwd / "embedline-output"))
    assert latest.attrs["run_key"] == runs["second"][0]
    _assert_frame(latest, runs["second"][1], delta=True)
    earlier = embedline.read_embeddings(str(cwd / "embedline-output"), run=runs["first"][0][:10])
    _assert_frame(earlier, runs["first"][1])
    # the folder of chunks holds both runs' objects: what read_embeddings avoids
    import pandas as pd

    mixed = pd.read_parquet(cwd / "embedline-output" / "chunks")
    assert len(mixed) > len(latest)


def test_arrow_variant_keeps_the_chunk_objects_buffers(two_runs) -> None:
    cwd, runs = two_runs
    table = embedline.read_embeddings_arrow(str(cwd / "embedline-output"), run=runs["first"][0])
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert table.column("embedding").num_chunks == 5  # one per chunk object: nothing combined
    assert table.num_rows == 250


def test_unknown_run_is_an_input_error(two_runs) -> None:
    cwd, _ = two_runs
    with pytest.raises(embedline.InputError, match="no committed run"):
        embedline.read_embeddings(str(cwd / "embedline-output"), run="deadbeef00")
    with pytest.raises(embedline.InputError, match="no committed run"):
        embedline.read_embeddings(str(cwd / "nothing-here"))


def test_guide_reading_examples_run_as_written(two_runs, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd, runs = two_runs
    guide = (REPO / "docs" / "guide" / "reading.md").read_text()
    section = guide.split("## Reading the vectors", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(cwd)
    printed = []
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, "docs/guide/reading.md", "exec"), {})  # noqa: S102 — our own guide
        printed.append(out.getvalue())
    kept = [i for i, t in runs["second"][1] if t.strip()]
    assert printed[0].startswith(f"{len(kept)} ['id', 'embedding', 'text_sha256'] float32 (384,)")
    assert "Array(Float32, shape=(384,))" in printed[1]
    assert printed[2].startswith("('0ad', 1.0)")


def test_reads_an_s3_output(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = read_rows(SAMPLE, 120)
    env = moto_env(moto_endpoint)
    key = _run(
        tmp_path,
        fake_openai,
        write_rows(tmp_path / "in.csv", rows),
        f"s3://{s3_bucket}/emb",
        env=env,
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    frame = embedline.read_embeddings(f"s3://{s3_bucket}/emb")
    assert frame.attrs["run_key"] == key
    _assert_frame(frame, rows)
    assert os.environ["AWS_ENDPOINT_URL"] == moto_endpoint
