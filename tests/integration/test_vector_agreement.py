"""What the server returns agrees with the run (issue 22 item 3): every vector of a committed
run has the run's length, is finite and arrives once per input. A real ``embedline run``
process against the loopback fake server switched into each misbehaviour; a run may fail,
it may never commit mixed vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.csv_data import write_rows
from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.output import read_local_output

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

TEXTS = {f"{i:03d}": f"package {i} does useful thing number {i * 7}" for i in range(20)}


def _input(tmp_path: Path, texts: dict[str, str]) -> None:
    write_rows(tmp_path / "in.csv", list(texts.items()))


def _run(tmp_path: Path, server: FakeEmbeddingServer, *extra: str) -> tuple[int, str]:
    args = [
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-retries",
        "0",
        *extra,
    ]
    result = run_cli(*args, cwd=tmp_path)
    return result.returncode, result.stdout + result.stderr


def _manifests(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in (tmp_path / "out" / "manifests").glob("*.json")]


def _chunk_lengths(tmp_path: Path) -> set[int]:
    """The vector length of every non-empty chunk object under the output."""
    lengths = set()
    for path in (tmp_path / "out" / "chunks").glob("*.parquet"):
        table = pq.read_table(path)
        if table.num_rows:
            lengths.add(table.schema.field("embedding").type.list_size)
    return lengths


def _assert_every_manifest_agrees(tmp_path: Path) -> None:
    """Each committed manifest's chunk objects all hold vectors of its ``dimensions``."""
    for manifest in _manifests(tmp_path):
        for entry in manifest["chunks"]:  # type: ignore[union-attr]
            table = pq.read_table(tmp_path / "out" / entry["object"])
            if table.num_rows:
                length = table.schema.field("embedding").type.list_size
                assert length == manifest["dimensions"], (manifest["run_key"], entry)


def test_a_length_change_between_requests_of_a_chunk_is_a_bad_response_retried_once(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path, dict(list(TEXTS.items())[:10]))
    fake_openai.change_dims_after = 1  # request 1: 384 dimensions; then 255
    args = ("--chunk-size", "10", "--batch-size", "5", "--concurrency", "1")
    code, out = _run(tmp_path, fake_openai, *args)
    assert code == 1, out
    assert fake_openai.requests == 3  # the second batch's bad answer is sent once more
    assert "expected 384 dimensions" in out and "got 255" in out, out
    assert not (tmp_path / "out" / "chunks").exists() or _chunk_lengths(tmp_path) == set()
    assert _manifests(tmp_path) == []


@pytest.mark.parametrize(
    "runner",
    [
        "threads",
        pytest.param("dask", marks=pytest.mark.slow),
    ],  # CI's 20-minute budget: make test-all runs it
)
def test_chunks_answered_with_another_length_are_never_committed_together(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, runner: str
) -> None:
    """Request 1 answers 384 dimensions, every later one 255: chunks running at once (in
    threads, or on Dask workers that share no memory) publish both lengths. No run commits
    them together: the run's length is its first answer's, and a chunk published with
    another is embedded again as its next generation, in the same run or the rerun."""
    _input(tmp_path, TEXTS)
    fake_openai.change_dims_after = 1
    args = ("--chunk-size", "5", "--batch-size", "5", "--concurrency", "2", "--task-runner", runner)
    code, out = _run(tmp_path, fake_openai, *args)
    _assert_every_manifest_agrees(tmp_path)
    assert "embedding them again as their next generation" in out, out
    if code == 1:  # the first answer (384) set the run's length: nothing committed
        assert _manifests(tmp_path) == [] and "expected 384 dimensions" in out, out
        code, out = _run(tmp_path, fake_openai, *args)
    assert code == 0, out
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["dimensions"] == 255 and set(vectors) == set(TEXTS)
    for row_id, text in TEXTS.items():
        np.testing.assert_allclose(vectors[row_id], expected_vector(text, 255), atol=1e-6)
    _assert_every_manifest_agrees(tmp_path)


def test_a_nan_in_one_vector_fails_its_chunk_and_publishes_nothing(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path, dict(TEXTS, **{"004": "this text gets a NANROW vector"}))
    fake_openai.nan_texts_containing = "NANROW"
    code, out = _run(tmp_path, fake_openai, "--chunk-size", "20")
    assert code == 1, out
    assert fake_openai.requests == 2  # a bad 200 is retried once
    assert "NaN" in out
    assert _manifests(tmp_path) == []


@pytest.mark.parametrize("fault", ["duplicate_index", "drop_last_item", "string_values"])
def test_an_answer_without_one_number_vector_per_input_fails_the_chunk(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, fault: str
) -> None:
    """A 200 whose ``data`` gives one input two vectors (and another none), lacks one, or
    holds numbers as JSON strings (a dtype the API never sends) is a bad response."""
    _input(tmp_path, TEXTS)
    setattr(fake_openai, fault, True)
    code, out = _run(tmp_path, fake_openai, "--chunk-size", "20", "--encoding-format", "float")
    assert code == 1, out
    assert fake_openai.requests == 2
    assert _manifests(tmp_path) == []


def test_vectors_reused_from_a_run_of_another_length_are_sent_again(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """--dimensions unset and the server's default changed between two nights: the texts
    known from last night have 384-long vectors, tonight's answers are 255 long."""
    first = dict(list(TEXTS.items())[:10])
    _input(tmp_path, first)
    assert _run(tmp_path, fake_openai, "--chunk-size", "10")[0] == 0
    fake_openai.change_dims_after = 0  # every answer from now on: 255
    _input(tmp_path, TEXTS)  # chunk 0: last night's texts (reusable); chunk 1: new texts
    code, out = _run(tmp_path, fake_openai, "--chunk-size", "10")
    assert code == 0, out
    _assert_every_manifest_agrees(tmp_path)
    tonight = max(_manifests(tmp_path), key=lambda m: str(m["created_at"]))
    assert tonight["dimensions"] == 255 and tonight["rows_published"] == 20
    assert ".g1." in str(tonight["chunks"][0]["object"])  # last night's object stays as it was
    for entry in tonight["chunks"]:  # type: ignore[union-attr]
        table = pq.read_table(tmp_path / "out" / entry["object"])
        pairs = zip(table["id"].to_pylist(), table["embedding"].to_pylist(), strict=True)
        for row_id, vector in pairs:
            np.testing.assert_allclose(vector, expected_vector(TEXTS[row_id], 255), atol=1e-6)


def test_a_retry_generation_answered_with_another_length_is_not_committed(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = dict(list(TEXTS.items())[:5], **{"099": "a FLAKY row"})  # chunk 1: that row alone
    _input(tmp_path, texts)
    fake_openai.reject_texts_containing = "FLAKY"
    args = ("--chunk-size", "5", "--concurrency", "1", "--allow-failed-rows")
    code, out = _run(tmp_path, fake_openai, *args)
    assert code == 0, out  # committed at 384 with one dead letter
    assert [m["dimensions"] for m in _manifests(tmp_path)] == [384]
    fake_openai.reject_texts_containing = None
    fake_openai.change_dims_after = 0
    fake_openai.reset()
    code, out = _run(tmp_path, fake_openai, *args, "--retry-dead-letters")
    assert code == 1, out
    assert fake_openai.requests == 2  # the dead letter, its bad answer sent once more
    assert len(_manifests(tmp_path)) == 1  # no generation 1 of mixed lengths
    _assert_every_manifest_agrees(tmp_path)
