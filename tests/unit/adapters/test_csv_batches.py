"""Planning's Arrow path (``csv_batches``) plans exactly as ``csv.reader`` does: the same
plan (every chunk field, the per-row facts in ``chunks.arrow``, the file's hash), the same
error word for word; where a block is not Arrow's to take it hands over mid-file and the
result is still the same. Generated UTF-8 exports with each kind of oddity a real export
has (quotes of every sort, blank lines, a lone CR, whitespace texts, odd ids, the header
again) at a random place, read with blocks small enough that records cross them."""

from __future__ import annotations

import csv
import hashlib
import io
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from adapters import csv_batches, csv_lines, csv_source
from adapters.csv_batches import RecordBlocks, record_end
from adapters.csv_source import plan_csv
from embedline.errors import InputError
from tests.support.real_data import ENGLISH_NAME, JAPANESE_NAME, real_csv

_TEXTS = [
    "plain words",
    'say "hi"',  # doubled when written
    "two\nlines",
    "crlf\r\ninside",
    "a,b",
    "日本語の説明",
    "",
    " ",
    "\u3000",  # ideographic space: whitespace by str.isspace
    "\x1c",  # file separator: whitespace by str.isspace, not by Arrow
    "\x85",
    "\t\n",
    "trailing\n",
    'end quote"',
]

#: Oddities inserted at a random record: (what, raw bytes of the record or lines).
_ODDITIES = [
    ("clean", None),
    ("stray quote in an unquoted field", b'r9,5" floppy\n'),
    ("text after a closing quote", b'r9,"ab"cd\n'),
    ("a quote opening after a space", b'r9, "a,b"\n'),
    ("blank line", b"\n"),
    ("whitespace line", b"   \n"),
    ("lone CR in an unquoted field", b"r9,a\rb\n"),
    ("lone CR as a field", b"\r,r9\n"),
    ("lone CRs making lines of their own", b"r8,a\rr9,b\n\n"),
    ("the header again", b"id,text\n"),
    ("empty id", b",text\n"),
    ("whitespace id", b"  ,text\n"),
    ("unit separator in the id", b"\x1f,text\n"),
    ("an extra empty field", b"r9,text,\n"),
    ("an extra field", b"r9,text,more\n"),
    ("undecodable byte", b"r9,caf\xe9\n"),
    ("quote never closed", b'r9,"open\n'),
    ("duplicate id", b"r0001,again\n"),
    ("a BOM before a record", b"\xef\xbb\xbfr9,text\n"),  # Arrow drops one at its start
]


def _field(value: str) -> str:
    if any(c in value for c in ',"\r\n'):
        return '"' + value.replace('"', '""') + '"'
    return value


def _export(seed: int, oddity: bytes | None) -> bytes:
    rng = random.Random(seed)
    records = [b"id,text\n"]
    for i in range(rng.randint(5, 80)):
        text = "".join(rng.choice(_TEXTS) for _ in range(rng.randint(1, 3)))
        if i == 0:
            text = "first"
        if rng.random() < 0.05:
            text = "long " * rng.randint(100, 2000)
        records.append(f"r{i:04d},{_field(text)}\n".encode())
    if oddity is not None:
        records.insert(rng.randint(1, len(records)), oddity)
    raw = b"".join(records)
    return raw.rstrip(b"\n") if rng.random() < 0.2 else raw


def _plan(path: Path, chunk_size: int, truncate_bytes: int | None = None) -> Any:
    """The plan and its per-row facts, or the error as (message, path, line, column)."""
    scratch = path.parent / f"scratch-{random.random()}"
    scratch.mkdir()
    try:
        plan = plan_csv(
            path,
            id_column="id",
            text_column="text",
            codec="utf-8",  # "auto" would take an export with a stray byte for cp1252
            chunk_size=chunk_size,
            model="m",
            dimensions=None,
            truncate_bytes=truncate_bytes,
            scratch_root=str(scratch),
        )
    except InputError as exc:
        return ("InputError", str(exc), exc.path, exc.line, exc.column)
    with pa.memory_map(f"{plan.scratch}/chunks.arrow") as source:
        facts = pa.ipc.open_file(source).read_all()
    return plan.sha256, plan.bytes, plan.rows, plan.chunks, plan.source, facts.to_pylist()


def _both(
    monkeypatch: pytest.MonkeyPatch, path: Path, chunk_size: int, truncate_bytes: int | None = None
) -> tuple[Any, int]:
    """(outcome with the Arrow path, rows it took); asserts the reference (``csv.reader``
    on every record) gives the same outcome."""
    with monkeypatch.context() as patch:
        patch.setattr(csv_source, "batches_apply", lambda *args, **kwargs: False)
        expected = _plan(path, chunk_size, truncate_bytes)
    taken = 0
    batches = RecordBlocks.batches

    def counted(self: RecordBlocks, shape: Any) -> Any:
        nonlocal taken
        for batch in batches(self, shape):
            taken += len(batch.ids)
            yield batch

    with monkeypatch.context() as patch:
        patch.setattr(RecordBlocks, "batches", counted)
        got = _plan(path, chunk_size, truncate_bytes)
    assert got == expected
    return got, taken


@pytest.mark.parametrize("what, oddity", _ODDITIES, ids=[w for w, _ in _ODDITIES])
def test_each_oddity_plans_as_csv_reader_does_wherever_it_falls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, oddity: bytes | None
) -> None:
    path = tmp_path / "in.csv"
    took_some = False
    for seed in range(6):
        path.write_bytes(_export(seed, oddity))
        for block_bytes, chunk_size in ((64, 1), (512, 7), (1 << 20, 1000)):
            monkeypatch.setattr(csv_lines, "BLOCK_BYTES", block_bytes)
            _, taken = _both(monkeypatch, path, chunk_size)
            took_some = took_some or taken > 0
    assert took_some, "the Arrow path never took a block: the test proves nothing"


def test_a_clean_export_is_read_by_arrow_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(_export(3, None) + b"r9999,last\n")
    monkeypatch.setattr(csv_lines, "BLOCK_BYTES", 256)
    got, taken = _both(monkeypatch, path, 5)
    assert taken == got[2] > 0  # every row


def test_a_bom_before_the_first_data_record_stays_in_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cat header.csv rows.csv`` with rows saved as Excel's "CSV UTF-8": the id holds
    U+FEFF, as ``csv.reader`` reads it, so a duplicate of it is still found."""
    path = tmp_path / "in.csv"
    path.write_bytes(b"id,text\n\xef\xbb\xbfr1,a\n\xef\xbb\xbfr1,b\n")
    got, _ = _both(monkeypatch, path, 3)
    assert got[0] == "InputError" and "duplicated id" in got[1]


def test_a_record_longer_than_arrows_block_is_read_by_arrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "in.csv"
    long = ("word " * 250_000 + "\n") * 2  # 2.5 MB over two lines, quoted
    path.write_bytes(f'id,text\nr1,short\nr2,"{long}"\nr3,after\n'.encode())
    got, taken = _both(monkeypatch, path, 2)
    assert taken == got[2] == 3


def _record_end_reference(data: bytes, after: int) -> int:
    ends = [
        i + 1
        for i, byte in enumerate(data)
        if byte == 0x0A and i >= after and data[:i].count(b'"') % 2 == 0
    ]
    return ends[-1] if ends else 0


def test_record_end_agrees_with_counting_quotes_before_every_newline() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        data = bytes(rng.choice(b'ab",\n') for _ in range(rng.randint(0, 400)))
        after = rng.randint(0, len(data))
        assert record_end(data, after) == _record_end_reference(data, after), (data, after)


@pytest.mark.parametrize("name", [ENGLISH_NAME, JAPANESE_NAME])
def test_the_real_debian_files_plan_alike_and_arrow_takes_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / "real.csv"
    path.write_bytes(Path(real_csv(name)).read_bytes())
    got, taken = _both(monkeypatch, path, 997)
    assert taken == got[2]


@pytest.mark.parametrize("name", [ENGLISH_NAME, JAPANESE_NAME])
def test_truncated_texts_plan_alike_and_hash_the_cut_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """``--on-too-long truncate``: both paths hash each text's first N UTF-8 bytes less a
    character cut in two (3-byte kana, a 4-byte emoji at every offset of the cut)."""
    path = tmp_path / "real.csv"
    rows = list(csv.reader(io.StringIO(Path(real_csv(name)).read_text("utf-8"))))[:400]
    rows += [[f"emoji{i}", "title", "x" * i + "\U0001f600" * 40] for i in range(4)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    limit = 100
    got, taken = _both(monkeypatch, path, 37, truncate_bytes=limit)
    assert taken == got[2] == len(rows) - 1
    text_at = rows[0].index("text")
    cut = [r[text_at].encode()[:limit].decode("utf-8", errors="ignore") for r in rows[1:]]
    assert sum(c != r[text_at] for c, r in zip(cut, rows[1:], strict=True)) > 100
    expected = [hashlib.sha256(c.encode()).hexdigest() for c in cut]
    whole = _plan(path, 37)
    assert got[0] == whole[0] and got[3] != whole[3]  # the file's hash, other chunk keys
    hashes = _row_hashes(got)
    assert hashes == expected and _row_hashes(whole) != expected


def _row_hashes(outcome: Any) -> list[str]:
    """The per-row text hashes a plan spilled, in input order."""
    return [row["text_sha256"] for row in outcome[5]]


@pytest.mark.parametrize(
    "data, end",
    [
        (b"a,b\nc,d\n", 8),
        (b'a,"b\nc"\nd,', 8),  # the second newline is the last outside quotes
        (b'a,"b\nc', 0),  # inside a quoted field
        (b'a,"x""y"\n', 9),
        (b"no newline", 0),
    ],
)
def test_record_end_is_the_last_newline_outside_quotes(data: bytes, end: int) -> None:
    assert record_end(data) == end


@pytest.mark.parametrize(
    "block, plain",
    [
        (b'1,"a""b"\n', True),
        (b'1,""\n', True),
        (b'"1","x"\r\n', True),
        (b'1,a"b\n', False),  # a quote inside an unquoted field
        (b'1,"a"b\n', False),  # text after the closing quote
        (b'1,""b\n', False),  # an empty quoted field, then text
        (b'1,"a\n"b\n', False),  # closing at a line's start, then text
        (b'1,"a"\rb\n', False),  # a lone CR after the closing quote
        (b'1,"open\n', False),
        (b'1,"a\rb"\n', True),  # a CR inside a quoted field
        (b"1,a\r\n", True),
        (b"\r,a\n", False),  # a lone CR at a line's start: Arrow skips it as an empty line
        (b"1,a\rb\n", False),
        (b'1,"a"\r', False),
    ],
)
def test_plain_accepts_only_what_both_parsers_read_alike(block: bytes, plain: bool) -> None:
    assert csv_batches._plain(block, ord(",")) is plain
