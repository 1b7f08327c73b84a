"""Keys follow docs/reference/keys.md byte for byte: outside checks recompute them."""

from __future__ import annotations

import hashlib

import pytest

from embedline import keys
from embedline.keys import columns_lines, cut_text, run_key


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


@pytest.mark.parametrize(
    "text, limit, expected",
    [
        ("short", 10, "short"),
        ("exactly10!", 10, "exactly10!"),
        ("eleven char", 10, "eleven cha"),
        ("ああああ", 7, "ああ"),  # 3-byte kana: the third would be split
        ("ああああ", 9, "あああ"),
        ("ab\U0001f600cd", 5, "ab"),  # a 4-byte emoji cut in two is dropped whole
        ("ab\U0001f600cd", 6, "ab\U0001f600"),
        ("\U0001f600", 3, ""),
        ("any text", None, "any text"),
    ],
)
def test_cut_text_keeps_whole_characters_within_the_byte_limit(
    text: str, limit: int | None, expected: str
) -> None:
    cut = cut_text(text, limit)
    assert cut == expected
    assert limit is None or len(cut.encode()) <= limit


def test_a_truncating_run_has_its_own_documents_line_and_run_key() -> None:
    assert columns_lines(None, truncate_bytes=24573) == ["truncate:24573"]
    assert columns_lines("{title}", (), normalize="NFC", truncate_bytes=30) == [
        'template:"{title}"',
        "normalize:NFC",
        "truncate:30",
    ]
    whole = run_key("f" * 64, "id", "text", "m", None, 100)
    cut = run_key("f" * 64, "id", "text", "m", None, 100, columns=["truncate:30"])
    assert cut != whole
    assert (
        cut
        == hashlib.sha256(
            "\n".join(["run.v1", "f" * 64, "id", "text", "m", "", "100", "truncate:30"]).encode()
        ).hexdigest()
    )
