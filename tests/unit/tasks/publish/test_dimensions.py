"""The run's vector length (docs/reference/failure-classes.md) and the commit's last line of
defence: a manifest never lists chunk objects of two lengths. Chunk objects are real Parquet files
published to a local directory store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapters.object_store import open_store
from embedline import keys
from embedline.errors import BadResponseError
from embedline.models import ChunkOutcome, ChunkSpec, Row
from tasks.embed.rows import EmbeddedRows
from tasks.publish.chunk_object import publish_chunk
from tasks.publish.dimensions import RunLength, checked_dimensions, other_lengths, with_lengths


def _publish(store: object, index: int, dims: int, *, sent: int | None = 2) -> ChunkOutcome:
    texts = [f"text {index} {i}" for i in range(2)]
    rows = [
        Row(10 * index + i, 10 * index + i + 1, f"id{index}-{i}", t, keys.text_sha256(t))
        for i, t in enumerate(texts)
    ]
    spec = ChunkSpec(
        index=index,
        key=f"{index:064x}",
        first_row=10 * index,
        line_start=2,
        rows=2,
        byte_start=0,
        byte_stop=1,
        bytes_sha256="0" * 64,
    )
    vectors = np.ones((2, dims), dtype=np.float32)
    embedded = EmbeddedRows(rows=rows, vectors=vectors, row_keys=["k", "k"])
    return publish_chunk(
        store,
        spec,
        embedded,
        model="m",
        dimensions=dims,
        rows_sent=sent,  # type: ignore[arg-type]
    )


def _forgotten(outcome: ChunkOutcome) -> ChunkOutcome:
    """The outcome as the ledger knows it: no length."""
    from dataclasses import replace

    return replace(outcome, dimensions=None, rows_sent=None)


def test_the_commit_refuses_chunk_objects_of_two_lengths(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    done = {0: _forgotten(_publish(store, 0, 8)), 1: _forgotten(_publish(store, 1, 6))}
    with pytest.raises(BadResponseError, match=r"\[6, 8\] dimensions"):
        checked_dimensions(store, done, None)
    assert checked_dimensions(store, {0: done[0]}, None) == 8
    with pytest.raises(BadResponseError):
        checked_dimensions(store, {0: done[0]}, 6)  # --dimensions 6, an object of 8


def test_lengths_are_read_from_the_objects_footers(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    done = with_lengths(store, {0: _forgotten(_publish(store, 0, 8, sent=0))})
    assert done[0].dimensions == 8 and done[0].rows_sent == 0


def test_the_first_answer_of_the_run_decides_not_an_older_object(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    older = _publish(store, 0, 8)  # published by last night's run: skipped tonight
    length = RunLength()
    assert length.current() is None
    assert length.decide([older]) == 8  # nothing sent tonight: the published rows decide
    tonight = _publish(store, 1, 6)
    length.answered([tonight])
    assert length.current() == 6 and length.decide([older, tonight]) == 6
    assert other_lengths({0: older, 1: tonight}, 6) == [0]
    assert RunLength(pinned=8).decide([older, tonight]) == 8


def test_reused_only_chunks_do_not_set_the_length(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    length = RunLength()
    length.answered([_publish(store, 0, 8, sent=0)])
    assert length.current() is None
