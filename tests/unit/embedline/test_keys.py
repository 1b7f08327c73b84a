"""Keys follow docs/reference/keys.md byte for byte: outside checks recompute them."""

from __future__ import annotations

import hashlib

from embedline import keys


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_text_sha256_is_of_exact_utf8_text_without_trimming() -> None:
    assert keys.text_sha256(" héllo\n") == _sha(" héllo\n")
    assert keys.text_sha256("a") != keys.text_sha256("a ")


def test_row_key_joins_with_unit_separator_and_empty_unset_dimensions() -> None:
    t = _sha("text")
    assert keys.row_key("007", t, "m", None) == _sha(f"007\x1f{t}\x1fm\x1f")
    assert keys.row_key("007", t, "m", 256) == _sha(f"007\x1f{t}\x1fm\x1f256")


def test_request_key_is_sha_of_row_keys_joined_by_newline() -> None:
    assert keys.request_key(["a", "b"]) == _sha("a\nb")
    assert keys.request_key(["a", "b"]) != keys.request_key(["b", "a"])


def test_chunk_key_matches_the_documented_formula_and_the_builder() -> None:
    rows = [("1", _sha("x")), ("2", _sha("y"))]
    expected = _sha("\n".join(["chunk.v1", "m", "384", "1\x1f" + _sha("x"), "2\x1f" + _sha("y")]))
    assert keys.chunk_key("m", 384, rows) == expected
    builder = keys.ChunkKeyBuilder("m", 384)
    for row_id, text_hash in rows:
        builder.add(row_id, text_hash)
    assert builder.hexdigest() == expected and builder.rows == 2


def test_chunk_key_depends_on_model_dimensions_and_order() -> None:
    rows = [("1", _sha("x")), ("2", _sha("y"))]
    base = keys.chunk_key("m", None, rows)
    assert base == _sha("\n".join(["chunk.v1", "m", "", "1\x1f" + _sha("x"), "2\x1f" + _sha("y")]))
    assert keys.chunk_key("other", None, rows) != base
    assert keys.chunk_key("m", 8, rows) != base
    assert keys.chunk_key("m", None, rows[::-1]) != base


def test_run_key_matches_the_documented_formula() -> None:
    got = keys.run_key("abc", "id", "text", "m", None, 1000)
    assert got == _sha("\n".join(["run.v1", "abc", "id", "text", "m", "", "1000"]))
    assert keys.run_key("abc", "id", "text", "m", None, 999) != got
