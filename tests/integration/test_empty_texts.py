"""Empty and whitespace-only texts (issue 22 item 12): a property of the input, not a failure
to embed. By default they are skipped, counted and listed as ``empty_text`` dead letters and
the run commits (exit 0); ``--on-empty-text fail`` keeps the strict behaviour (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.csv_data import write_rows
from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.output import read_local_output

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

TEXTS = {f"{i:03d}": f"package {i} does useful thing number {i * 7}" for i in range(10)}
EMPTY = {"004": "", "007": "   \t"}


def _input(tmp_path: Path, texts: dict[str, str]) -> None:
    write_rows(tmp_path / "in.csv", list(texts.items()))


def _run(tmp_path: Path, server: FakeEmbeddingServer, *extra: str) -> tuple[int, str, str]:
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
        "--chunk-size",
        "5",
        *extra,
    ]
    result = run_cli(*args, cwd=tmp_path)
    return result.returncode, result.stdout, result.stderr


def _dead_letters(tmp_path: Path, run_key: str) -> list[list[str]]:
    ledger = str(tmp_path / "ledger.sqlite3")
    dead = run_cli("dead-letters", run_key, "--ledger", ledger, cwd=tmp_path)
    return [line.split("\t")[:2] for line in dead.stdout.splitlines()]


def test_empty_texts_are_skipped_counted_and_listed_and_the_run_commits(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = {**TEXTS, **EMPTY}
    _input(tmp_path, texts)
    code, out, err = _run(tmp_path, fake_openai)
    assert code == 0, out + err
    assert "2 empty texts skipped" in out, out
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_published"] == 8 and manifest["rows_failed"] == 2
    assert manifest["rows_published"] + manifest["rows_failed"] == manifest["input"]["rows"]
    assert manifest["dead_letters"] == {"empty_text": 2}
    assert set(vectors) == set(texts) - set(EMPTY)
    for row_id, vector in vectors.items():
        np.testing.assert_allclose(vector, expected_vector(texts[row_id]), atol=1e-6)
    assert _dead_letters(tmp_path, out.split()[1]) == [["004", "empty_text"], ["007", "empty_text"]]
    assert sum(e["n_inputs"] for e in fake_openai.log) == 8  # never sent


def test_on_empty_text_fail_keeps_the_strict_behaviour_and_a_default_rerun_commits(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path, {**TEXTS, **EMPTY})
    code, out, err = _run(tmp_path, fake_openai, "--on-empty-text", "fail")
    assert code == 1, out + err
    assert "dead letters" in out and "--allow-failed-rows" in out, out
    manifests = tmp_path / "out" / "manifests"
    assert not manifests.exists() or not list(manifests.iterdir())
    # the same input with the default: every chunk is published, committed without Prefect
    fake_openai.reset()
    code, out, err = _run(tmp_path, fake_openai)
    assert code == 0, out + err
    assert fake_openai.requests == 0
    assert "2 empty texts skipped" in out, out
    manifest = json.loads(next((tmp_path / "out" / "manifests").glob("*.json")).read_text())
    assert manifest["rows_failed"] == 2 and manifest["dead_letters"] == {"empty_text": 2}


def test_other_dead_letters_still_block_the_commit_beside_empty_texts(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _input(tmp_path, {**TEXTS, **EMPTY, "009": "a POISON row"})
    fake_openai.reject_texts_containing = "POISON"
    code, out, err = _run(tmp_path, fake_openai)
    assert code == 1, out + err
    assert "1 row is a dead letter" in out, out
    code, out, err = _run(tmp_path, fake_openai, "--allow-failed-rows")
    assert code == 0, out + err
    manifest = json.loads(next((tmp_path / "out" / "manifests").glob("*.json")).read_text())
    assert manifest["dead_letters"] == {"empty_text": 2, "rejected": 1}
