"""Files as users really export them (issue 8, items 11-12): other delimiters, Excel's UTF-16
"Unicode Text", CR-only line ends, gzip, legacy encodings detected, and clear refusals."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import zipfile
from pathlib import Path

import pytest

from adapters.csv_chunks import read_chunk
from adapters.csv_header import check_header
from adapters.csv_source import plan_csv
from embedline.errors import InputError
from embedline.models import InputPlan

ROWS = [
    ("007", "first, with a comma"),
    ("008", "second\nover two lines"),
    ("009", "café ünïcode 日本語"),
    ("010", 'a "quoted" word'),
]


def _text(rows: list[tuple[str, str]], *, delimiter: str = ",", newline: str = "\n") -> str:
    buf = io.StringIO()
    quoting = csv.QUOTE_ALL if newline == "\r" else csv.QUOTE_MINIMAL  # quote the "\n" too
    writer = csv.writer(buf, delimiter=delimiter, lineterminator=newline, quoting=quoting)
    writer.writerow(("id", "title", "text"))
    writer.writerows((i, "t", text) for i, text in rows)
    return buf.getvalue()


def _plan(path: Path, *, codec: str = "auto", delimiter: str = "auto") -> InputPlan:
    return plan_csv(
        path,
        id_column="id",
        text_column="text",
        codec=codec,
        chunk_size=1,
        model="m",
        dimensions=None,
        delimiter=delimiter,
    )


def _read(plan: InputPlan) -> list[tuple[str, str]]:
    return [(r.id, r.text) for spec in plan.chunks for r in read_chunk(plan.source, spec)]


@pytest.mark.parametrize("delimiter", [";", "\t", "|", ","])
def test_auto_delimiter_is_found_in_the_header(tmp_path: Path, delimiter: str) -> None:
    path = tmp_path / "in.csv"
    path.write_text(_text(ROWS, delimiter=delimiter), encoding="utf-8")
    plan = _plan(path)
    assert plan.source.delimiter == delimiter
    assert _read(plan) == ROWS
    assert (repr(delimiter) in plan.source.note) == (delimiter != ",")


def test_an_explicit_delimiter_is_used_as_given(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(_text(ROWS, delimiter=";"), encoding="utf-8")
    assert _read(_plan(path, delimiter=";")) == ROWS
    with pytest.raises(InputError, match="no id column 'id'") as info:
        _plan(path, delimiter=",")
    # the header read as one column: the delimiter is named, not --id-column
    assert "check --delimiter (auto finds , ; tab |; pass --delimiter ';')" in str(info.value)
    assert "Pass --id-column" not in str(info.value)


def test_a_missing_kept_column_is_not_told_about_placeholders(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(_text(ROWS), encoding="utf-8")
    with pytest.raises(InputError, match="no column named by --keep-columns 'nope'") as info:
        plan_csv(
            path,
            id_column="id",
            text_column="text",
            codec="auto",
            chunk_size=10,
            model="m",
            dimensions=None,
            keep_columns=("nope",),
        )
    assert "placeholder" not in str(info.value)


@pytest.mark.parametrize(
    "codec, bom", [("utf-16-le", codecs.BOM_UTF16_LE), ("utf-16-be", codecs.BOM_UTF16_BE)]
)
def test_excel_unicode_text_utf16_with_bom_tabs_and_crlf(
    tmp_path: Path, codec: str, bom: bytes
) -> None:
    path = tmp_path / "excel.txt"
    path.write_bytes(bom + _text(ROWS, delimiter="\t", newline="\r\n").encode(codec))
    plan = _plan(path)
    assert (plan.source.encoding, plan.source.delimiter) == (codec, "\t")
    assert codec in plan.source.note
    assert _read(plan) == ROWS
    assert plan.bytes == path.stat().st_size


def test_utf16_lines_split_only_on_whole_code_units(tmp_path: Path) -> None:
    # U+0A00..U+0AFF (Gurmukhi) put the byte 0x0A at odd offsets in UTF-16-LE
    rows = [("a", "\u0a05\u0a06 ਆ"), ("b", "\u0a0a\n\u0a0a")]
    path = tmp_path / "in.csv"
    path.write_bytes(codecs.BOM_UTF16_LE + _text(rows).encode("utf-16-le"))
    assert _read(_plan(path)) == rows


def test_cr_only_line_ends(tmp_path: Path) -> None:
    path = tmp_path / "mac.csv"
    path.write_bytes(_text(ROWS, newline="\r").encode("utf-8"))
    plan = _plan(path)
    assert plan.source.newline == "\r" and "CR only" in plan.source.note
    assert _read(plan) == ROWS


def test_legacy_encoding_is_detected_and_decoded_strictly(tmp_path: Path) -> None:
    rows = [
        (
            f"{i:03d}",
            f"日本語のパッケージ説明です。番号{i}は、とても便利なツールを提供します。"
            f"設定ファイルの書式は「{i}」章を参照してください。",
        )
        for i in range(20)
    ]
    path = tmp_path / "sjis.csv"
    path.write_bytes(_text(rows).encode("cp932"))
    plan = _plan(path)
    assert plan.source.encoding in ("cp932", "shift_jis", "shift_jis_2004", "shift_jisx0213")
    assert "charset-normalizer" in plan.source.note
    assert _read(plan) == rows
    with pytest.raises(InputError, match="not valid utf-8"):
        _plan(path, codec="utf-8")  # an explicit codec stays strict


@pytest.mark.parametrize(
    "language, text, codec, rows",
    [
        ("French", "café crème, garçon naïve à la française", "cp1252", 30),
        ("German", "Größe Übung schön für Bäcker", "cp1252", 30),
        ("French DOS", "déjà été à la maison", "cp850", 30),
        ("French ISO", "œuvre cœur à l'été", "iso8859-15", 30),
        ("Polish", "zażółć gęślą jaźń w Łodzi", "cp1250", 30),
        ("Lithuanian", "ąčęėįšųūž Vilniuje", "cp1257", 30),
        ("Turkish", "İstanbul'da ğüşıöç", "cp1254", 30),
        ("Russian", "Привет мир, как дела", "cp1251", 30),
        ("Russian KOI8, 3 rows", "Привет мир", "koi8-r", 3),
    ],
)
def test_a_code_page_the_bytes_cannot_tell_apart_is_refused_not_guessed(
    tmp_path: Path, language: str, text: str, codec: str, rows: int
) -> None:
    """Single-byte code pages, and Shift-JIS guesses that decode to half-width katakana:
    charset-normalizer read French cp1252 as cp1250 ("crème" became "crčme", wrong vectors,
    exit 0), Lithuanian cp1257 as cp1251, Turkish cp1254 as KOI8-R, DOS cp850 as cp1252,
    3 rows of KOI8-R as Shift-JIS. Refused, showing how a byte reads in each code page
    (the right one among them); the same file with --encoding reads right."""
    data = [(f"{i:03d}", f"{text} {i}") for i in range(rows)]
    path = tmp_path / "in.csv"
    path.write_bytes(_text(data).encode(codec))
    with pytest.raises(
        InputError,
        match=r"code page cannot be told .* byte 0x[0-9A-F]{2} "
        r"reads: .* in cp1252",
    ) as caught:
        _plan(path)
    assert caught.value.line == 2 and "--encoding" in str(caught.value)
    first_word = next(w for w in f"{text} ".replace(",", " ").split() if not w.isascii())
    assert f"{first_word} in {codec} (" in str(caught.value)  # the right reading is offered
    assert _read(_plan(path, codec=codec)) == data


@pytest.mark.parametrize("tail", ["", "\n", "\n\n\n", "\r\n"])
def test_a_header_with_no_data_rows_is_refused(tmp_path: Path, tail: str) -> None:
    """It committed an empty run ("complete: every chunk was already published"), whose
    change set reads as every row removed: a sink load would empty the table."""
    path = tmp_path / "empty.csv"
    path.write_text("id,text" + tail, encoding="utf-8", newline="")
    with pytest.raises(InputError, match="no data rows") as caught:
        _plan(path)
    assert caught.value.line == 2


def test_an_export_whose_every_text_is_empty_is_refused(tmp_path: Path) -> None:
    """It committed a run of 0-dimension vectors that load and search then crashed on, and
    that no change set compared with the previous run (another dataset): the mass-delete
    guard never saw the export that lost every text."""
    path = tmp_path / "blank.csv"
    path.write_text('id,text\na,\nb,"   "\nc,"\t\n"\n', encoding="utf-8", newline="")
    with pytest.raises(InputError, match="every text in column 'text' is empty") as caught:
        _plan(path)
    assert caught.value.column == "text"
    path.write_text("id,text\na,\nb,x\n", encoding="utf-8", newline="")
    assert _plan(path).rows == 2  # one real text is enough


def test_utf8_without_bom_stays_utf8_with_no_note(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(_text(ROWS), encoding="utf-8")
    plan = _plan(path)
    assert (plan.source.encoding, plan.source.note) == ("utf-8", "")


def test_gzip_input_is_read_as_a_stream_with_decompressed_offsets(tmp_path: Path) -> None:
    raw = _text(ROWS).encode("utf-8")
    plain, packed = tmp_path / "in.csv", tmp_path / "in.csv.gz"
    plain.write_bytes(raw)
    packed.write_bytes(gzip.compress(raw))
    a, b = _plan(plain), _plan(packed)
    assert _read(b) == ROWS
    assert (b.sha256, b.bytes, [c.key for c in b.chunks]) == (
        a.sha256,
        a.bytes,
        [c.key for c in a.chunks],
    )


def test_zip_and_unnamed_gzip_are_refused_naming_the_format(tmp_path: Path) -> None:
    xlsx = tmp_path / "book.xlsx"
    with zipfile.ZipFile(xlsx, "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(InputError, match="ZIP archive"):
        check_header(xlsx, id_column="id", text_column="text", codec="auto")
    hidden = tmp_path / "data.csv"
    hidden.write_bytes(gzip.compress(_text(ROWS).encode()))
    with pytest.raises(InputError, match="gzip-compressed"):
        check_header(hidden, id_column="id", text_column="text", codec="auto")
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError, match="cannot decompress"):
        _plan(broken)


def test_a_bom_that_contradicts_the_encoding_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(codecs.BOM_UTF16_LE + _text(ROWS).encode("utf-16-le"))
    with pytest.raises(InputError, match="UTF-16-LE byte-order mark but --encoding is cp932"):
        _plan(path, codec="cp932")
