"""Putting a chunk back together: embedded, reused and copied vectors, in input order."""

from __future__ import annotations

import numpy as np

from embedline import keys
from embedline.models import DeadLetter, Row
from tasks.embed.rows import EmbeddedRows
from tasks.reuse.chunk_side import Reused, combine, split_duplicates


def _row(n: int, text: str) -> Row:
    return Row(n, n + 1, f"id{n}", text, keys.text_sha256(text))


def _vector(n: int) -> np.ndarray:
    return np.full(3, float(n), dtype=np.float32)


def test_each_row_gets_its_own_vector_whatever_its_source() -> None:
    texts = ["a", "reused", "a", "b", "bad", "bad", "", "c", "reused too", "b"]
    rows = [_row(n, t) for n, t in enumerate(texts, start=1)]
    send, copies = split_duplicates(rows)
    found = Reused({2: _vector(200), 9: _vector(900)})
    embedded_now = [r for r in send if r.row_number not in found.vectors and r.text]
    bad = [r for r in embedded_now if r.text == "bad"]
    embedded_now = [r for r in embedded_now if r.text != "bad"]
    embedded = EmbeddedRows(
        rows=embedded_now,
        vectors=np.stack([_vector(r.row_number) for r in embedded_now]),
        row_keys=[],
        dead_letters=[DeadLetter(r.row_number, r.id, "rejected", 400, 1) for r in bad]
        + [DeadLetter(7, "id7", "empty_text", None, 0)],
    )
    whole = combine(rows, embedded, found, copies, model="m", dimensions=None)
    # row n's vector is that of the row whose text it first saw: 3 copies 1, 10 copies 4
    source = {1: 1, 2: 200, 3: 1, 4: 4, 8: 8, 9: 900, 10: 4}
    assert [r.row_number for r in whole.rows] == list(source)
    np.testing.assert_array_equal(whole.vectors, np.stack([_vector(v) for v in source.values()]))
    assert whole.vectors.dtype == np.float32 and whole.vectors.flags.c_contiguous
    assert [(d.row_number, d.reason) for d in whole.dead_letters] == [
        (5, "rejected"),
        (6, "rejected"),
        (7, "empty_text"),
    ]
    assert whole.row_keys == [keys.row_key(r.id, r.text_sha256, "m", None) for r in whole.rows]
    assert found.deduplicated == 2


def test_a_chunk_with_nothing_kept_has_an_empty_matrix_of_the_known_width() -> None:
    rows = [_row(1, "")]
    embedded = EmbeddedRows(
        rows=[],
        vectors=np.zeros((0, 4), np.float32),
        row_keys=[],
        dead_letters=[DeadLetter(1, "id1", "empty_text", None, 0)],
    )
    whole = combine(rows, embedded, Reused({}), [], model="m", dimensions=4)
    assert whole.rows == [] and whole.vectors.shape == (0, 4)
