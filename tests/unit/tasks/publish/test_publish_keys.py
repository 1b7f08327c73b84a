"""A copied chunk's row keys made in bulk (``embedline.keys.row_key_digests``,
``adapters.scratch.hex_digests`` and ``fold_fingerprint``) are the keys and fingerprint that
``row_keys`` and ``rows_fingerprint`` give row by row (docs/reference/keys.md: outside checks
recompute them)."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.scratch import hex_digests
from embedline.keys import row_key, row_key_digests, row_keys, text_sha256
from tasks.publish.chunk_object import fold_fingerprint, rows_fingerprint


@pytest.mark.parametrize("rows", [0, 1, 5000])
def test_bulk_row_keys_are_the_row_by_row_keys(rows: int) -> None:
    ids = [f"pkg-{i}~ü" for i in range(rows)]
    hashes = [text_sha256(f"text {i}") for i in range(rows)]
    for dimensions in (64, None):
        raw = row_key_digests(ids, hashes, "text-embedding-3-small", dimensions)
        expected = row_keys(ids, hashes, "text-embedding-3-small", dimensions)
        assert len(raw) == 32 * rows
        assert hex_digests(raw).to_pylist() == expected
        digests = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 32)
        assert fold_fingerprint(digests) == rows_fingerprint(expected)
    if rows:
        assert expected[0] == row_key(ids[0], hashes[0], "text-embedding-3-small", None)
