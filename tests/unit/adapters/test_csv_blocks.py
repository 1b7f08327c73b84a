"""The block reader (``csv_lines.Blocks``) plans and reads exactly as the line reader
(``csv_lines.Lines``) does: the same plan (every chunk field, the file's hash, size and row
count), the same rows, the same errors word for word; on generated CSVs with tiny blocks (so
records and single lines cross blocks) and on the real Debian files."""

from __future__ import annotations

import codecs
import gzip
import hashlib
import itertools
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from adapters import csv_lines, csv_records
from adapters.csv_chunks import read_chunk
from adapters.csv_lines import Blocks, block_decodable
from adapters.csv_source import plan_csv
from embedline.errors import InputError
from embedline.models import InputPlan, Row
from tests.support.real_data import ENGLISH_NAME, JAPANESE_NAME, real_csv

_PIECES = [
    "plain",
    "",
    " ",
    "two\nlines",
    "crlf\r\ninside",
    "lone\rcarriage return",
    "\r",
    "\n",
    "\r\n\r\n",
    'say "hi"',
    '""',
    "a,b",
    "a;b",
    "tab\there",
    "日本語の説明",
    "絵文字 🎉",
    "ñandú",
    "line\u2028separator",
    "NEL\x85",
    "form\x0cfeed",
    "file\x1csep",
    "trailing\n",
    "\nleading",
    "  padded  ",
    'end quote"',
]


def _text(rng: random.Random, codec: str) -> str:
    """A field value made of ``_PIECES`` (or, now and then, longer than many blocks), all
    characters ``codec`` can encode."""
    if rng.random() < 0.06:
        text = "".join(rng.choice('ab \n"é語,') for _ in range(rng.randint(500, 9000)))
    else:
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 4)))
    return text.encode(codec, errors="ignore").decode(codec)


def _field(value: str, delimiter: str, quote_all: bool) -> str:
    """``value`` as a CSV writer would write it (quoted when it must be, or always)."""
    if quote_all or any(c in value for c in (delimiter, '"', "\r", "\n")):
        return '"' + value.replace('"', '""') + '"'
    return value


def _corpus_csv(seed: int) -> tuple[bytes, dict[str, Any]]:
    """A random CSV (bytes) and the ``plan_csv`` arguments that read it."""
    rng = random.Random(seed)
    codec = "cp932" if seed % 7 == 3 else "utf-8"
    ending = rng.choice(["\n", "\r\n"])
    delimiter = rng.choice([",", ",", ";", "\t"])
    quote_all = rng.random() < 0.3
    width = rng.choice([3, 4])
    lines = [
        delimiter.join(
            _field(name, delimiter, quote_all) for name in ["id", "title", "text", "note"][:width]
        )
        + ending
    ]
    for i in range(rng.randint(1, 60)):
        if rng.random() < 0.1:
            lines.append(ending * rng.randint(1, 3))  # blank lines between records
        row_id = f"r{i:04d}" if rng.random() < 0.8 else f"id {i} 日"
        row = [row_id, _text(rng, codec), "plain" if i == 0 else _text(rng, codec), ""]
        lines.append(delimiter.join(_field(v, delimiter, quote_all) for v in row[:width]) + ending)
    data = "".join(lines) + ending * rng.choice([0, 0, 1, 3])  # trailing blank lines
    if rng.random() < 0.3:
        data = data.rstrip("\r\n")  # no final newline
    raw = data.encode(codec)
    if codec == "utf-8" and rng.random() < 0.2:
        raw = codecs.BOM_UTF8 + raw
    kwargs: dict[str, Any] = {
        "codec": codec,
        "delimiter": "auto",
        "chunk_size": rng.choice([1, 2, 3, 7, 1000]),
    }
    if rng.random() < 0.25:
        kwargs.update(text_template="{title}\n\n{text}", keep_columns=("title",))
    return raw, kwargs


def _plan(path: Path, **kwargs: Any) -> InputPlan:
    args: dict[str, Any] = {
        "id_column": "id",
        "text_column": "text",
        "codec": "auto",
        "chunk_size": 3,
        "model": "m",
        "dimensions": None,
        **kwargs,
    }
    return plan_csv(path, **args)


def _rows(plan: InputPlan) -> list[list[Row]]:
    return [read_chunk(plan.source, spec) for spec in plan.chunks]


def _reference(monkeypatch: pytest.MonkeyPatch, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with every read going through ``Lines``."""
    with monkeypatch.context() as patch:
        patch.setattr(csv_records, "block_decodable", lambda codec, newline: False)
        return fn(*args, **kwargs)


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """What ``fn`` returns, or the InputError it raises as (message, path, line, column)."""
    try:
        return fn(*args, **kwargs)
    except InputError as exc:
        return ("InputError", str(exc), exc.path, exc.line, exc.column)


def _assert_same(
    monkeypatch: pytest.MonkeyPatch, path: Path, block_bytes: int, **kwargs: Any
) -> InputPlan | None:
    """Plan ``path`` and read every chunk with blocks of ``block_bytes`` and with lines;
    assert both give the same plan and rows (or the same error). Returns the plan."""
    expected = _reference(monkeypatch, _outcome, _plan, path, **kwargs)
    monkeypatch.setattr(csv_lines, "BLOCK_BYTES", block_bytes)
    got = _outcome(_plan, path, **kwargs)
    assert got == expected
    if not isinstance(got, InputPlan):
        return None
    assert _rows(got) == _reference(monkeypatch, _rows, got)
    return got


@pytest.mark.parametrize("seed", range(48))
def test_generated_csvs_plan_and_read_alike_with_tiny_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    raw, kwargs = _corpus_csv(seed)
    path = tmp_path / "in.csv"
    path.write_bytes(raw)
    for block_bytes in (1, 7, 64, 4096):
        plan = _assert_same(monkeypatch, path, block_bytes, **kwargs)
        assert plan is not None and plan.bytes == len(raw)


def test_generated_gzip_input_plans_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw, kwargs = _corpus_csv(5)
    path = tmp_path / "in.csv.gz"
    path.write_bytes(gzip.compress(raw))
    plan = _assert_same(monkeypatch, path, 64, **kwargs)
    assert plan is not None and plan.sha256 == hashlib.sha256(raw).hexdigest()


@pytest.mark.parametrize(
    "name, chunk_size, block_bytes",
    [(ENGLISH_NAME, 1000, csv_lines.BLOCK_BYTES), (JAPANESE_NAME, 97, 4096)],
)
def test_the_real_debian_files_plan_and_read_alike(
    monkeypatch: pytest.MonkeyPatch, name: str, chunk_size: int, block_bytes: int
) -> None:
    _assert_same(
        monkeypatch,
        real_csv(name),
        block_bytes,
        chunk_size=chunk_size,
        text_template="{title}\n\n{text}",
        keep_columns=("title",),
    )


def _bad(tmp_path: Path, raw: bytes) -> Path:
    path = tmp_path / "bad.csv"
    path.write_bytes(raw)
    return path


_LONG = "x" * 300
_GOOD = f'id,text\n1,"a\nb"\n2,{_LONG}\n3,"c,d"\n'.encode()


@pytest.mark.parametrize(
    "raw",
    [
        _GOOD + b'4,"never closed\n5,x\n',  # malformed: an unclosed quote
        _GOOD + b'4,"ab"cd\n',  # malformed: text after a closing quote
        _GOOD + b"4,a\rb\n",  # malformed: a lone CR in an unquoted field
        _GOOD + b"4,caf\xe9\n5,x\n",  # undecodable byte
        b"id,text\n1,caf\xe9\n" + _GOOD[8:] + b'4,"unclosed\n',  # undecodable before malformed
        _GOOD + b'4,"unclosed\n5,caf\xe9\n',  # malformed record running into an undecodable line
        _GOOD + b"4,x,extra\n",  # an extra non-empty field
        _GOOD + b"4\n",  # a missing field
        _GOOD + b",empty id\n",
        _GOOD + b"\x1f,unit separator in the id\n",
        _GOOD + b"1,duplicate\n3,again\n",
        b"id,text\n1,\n2,  \n",  # every text empty
        b"id,text\n\n\n",  # a header alone
        b"",
    ],
)
def test_bad_inputs_fail_with_the_same_message_line_and_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: bytes
) -> None:
    path = _bad(tmp_path, raw)
    for block_bytes in (5, 64, 1 << 20):
        assert _assert_same(monkeypatch, path, block_bytes, codec="utf-8") is None


def test_a_chunk_with_undecodable_bytes_is_read_by_lines_naming_the_byte(tmp_path: Path) -> None:
    """Planning refuses such bytes, so only a chunk spec made by hand can hold them."""
    plan = _plan(_bad(tmp_path, b"id,text\n1,ok\n2,caf\xe9\n"), codec="latin-1")
    utf8 = replace(plan.source, encoding="utf-8")
    spec = replace(
        plan.chunks[0],
        byte_stop=plan.bytes,
        rows=2,
        bytes_sha256=hashlib.sha256(b"1,ok\n2,caf\xe9\n").hexdigest(),
    )
    with pytest.raises(InputError, match="byte 0xe9 at byte 6 of this line") as caught:
        read_chunk(utf8, spec)
    assert caught.value.line == 3


def test_an_off_by_one_offset_in_the_block_reader_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above is sensitive: a chunk boundary one byte early differs."""
    raw, kwargs = _corpus_csv(1)
    path = tmp_path / "in.csv"
    path.write_bytes(raw)
    kwargs["chunk_size"] = 2
    good = _assert_same(monkeypatch, path, 64, **kwargs)
    offset_after = Blocks.offset_after
    monkeypatch.setattr(Blocks, "offset_after", lambda self, line: offset_after(self, line) - 1)
    assert _outcome(_plan, path, **kwargs) != good


@pytest.mark.parametrize("codec", sorted(csv_lines._BLOCK_CODECS))
def test_block_codecs_never_hide_a_newline_in_a_character(codec: str) -> None:
    """Decoding a block equals decoding its lines one by one only if 0x0A is never part of a
    multi-byte character and nothing but 0x0A reads as ``\\n``: every one- and two-byte
    sequence (and the four-byte GB18030 form) is checked."""
    assert block_decodable(codec, "\n")
    for lead in range(256):
        for tail in range(256):
            pair = bytes([lead, tail])
            try:
                text = pair.decode(codec)
            except UnicodeDecodeError:
                continue
            assert ("\n" in text) == (0x0A in pair), (codec, pair)
    if codec == "gb18030":
        for a, b in itertools.product(range(0x81, 0xFF), range(0x30, 0x3A)):
            assert "\n" not in bytes([a, b, 0x81, 0x30]).decode(codec, errors="replace")


@pytest.mark.parametrize(
    "codec, newline, expected",
    [
        ("utf-8", "\n", True),
        ("UTF8", "\n", True),
        ("cp932", "\n", True),
        ("cp1252", "\n", True),
        ("koi8-r", "\n", True),
        ("utf-8", "\r", False),
        ("utf-16-le", "\n", False),
        ("utf-16-be", "\n", False),
        ("iso2022_jp", "\n", False),
        ("hz", "\n", False),
        ("utf-7", "\n", False),
        ("cp037", "\n", False),  # EBCDIC: the newline is not 0x0A
    ],
)
def test_block_decodable_names_the_formats_the_block_reader_covers(
    codec: str, newline: str, expected: bool
) -> None:
    assert block_decodable(codec, newline) is expected


def test_a_line_longer_than_many_blocks_and_no_final_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_line = "y" * 10_000
    path = _bad(tmp_path, f'id,text\n1,{long_line}\n2,"{long_line}\n{long_line}"'.encode())
    plan = _assert_same(monkeypatch, path, 100, chunk_size=1)
    assert plan is not None
    assert [(c.byte_start, c.byte_stop, c.line_start) for c in plan.chunks] == [
        (8, 10_011, 2),
        (10_011, plan.bytes, 3),
    ]
