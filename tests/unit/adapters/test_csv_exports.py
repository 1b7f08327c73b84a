"""Exports as users have them: a TSV whose quotes are literal (``--quoting none``), Excel's
``sep=;`` first line, two exports joined with ``cat`` (a repeated header, with or without a
BOM), and the same texts in another Unicode normalization form (``--normalize``). Each is
decided at planning (before any request), and chunk reads agree with planning."""

from __future__ import annotations

import gzip
import unicodedata
from pathlib import Path

import pytest

from adapters.csv_chunks import read_chunk
from adapters.csv_header import check_header
from adapters.csv_source import plan_csv
from embedline.errors import InputError
from embedline.keys import columns_lines, text_sha256
from embedline.models import InputPlan
from embedline.settings import RunSettings

#: Texts a plain TSV holds as written: quotes at the start, a well-formed "…" field that must
#: keep its quotes, an unbalanced quote, doubled quotes.
LITERAL = [
    ("1", '"Quoted" at the start, then more'),
    ("2", '"a well-formed quoted field"'),
    ("3", 'an unbalanced " quote'),
    ("4", 'two ""doubled"" quotes'),
    ("5", '"'),
    ("6", "plain"),
]


def _tsv(rows: list[tuple[str, str]]) -> bytes:
    return "".join(f"{i}\t{t}\n" for i, t in [("id", "text"), *rows]).encode("utf-8")


def _plan(path: Path, **options: object) -> InputPlan:
    arguments: dict[str, object] = {
        "id_column": "id",
        "text_column": "text",
        "codec": "auto",
        "chunk_size": 2,
        "model": "m",
        "dimensions": None,
        "delimiter": "auto",
    }
    arguments.update(options)
    return plan_csv(path, **arguments)  # type: ignore[arg-type]


def _read(plan: InputPlan) -> list[tuple[str, str]]:
    return [(r.id, r.text) for spec in plan.chunks for r in read_chunk(plan.source, spec)]


# -- --quoting none -------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_quoting_none_reads_literal_quotes_as_written(tmp_path: Path, packed: bool) -> None:
    data = _tsv(LITERAL)
    path = tmp_path / ("in.tsv.gz" if packed else "in.tsv")
    path.write_bytes(gzip.compress(data) if packed else data)
    plan = _plan(path, quoting="none")
    assert plan.source.quoting == "none" and plan.source.delimiter == "\t"
    assert plan.rows == len(LITERAL) and len(plan.chunks) == 3
    assert _read(plan) == LITERAL  # every chunk read splits as planning did
    assert "quoting none" in plan.source.note


def test_quoting_none_is_checked_by_the_header_check_too(tmp_path: Path) -> None:
    path = tmp_path / "in.tsv"
    path.write_bytes(b'"id"\t"text"\n1\tx\n')
    with pytest.raises(InputError, match=r"""no id column 'id'.*'"id"'"""):
        check_header(
            path, id_column="id", text_column="text", codec="auto", delimiter="auto", quoting="none"
        )
    fmt = check_header(
        path, id_column='"id"', text_column='"text"', codec="auto", delimiter="\t", quoting="none"
    )
    assert fmt.quoting == "none"


def test_a_literal_quote_under_minimal_quoting_names_quoting_none(tmp_path: Path) -> None:
    path = tmp_path / "in.tsv"
    path.write_bytes(_tsv([("1", '"Quoted" at the start'), ("2", "plain")]))
    with pytest.raises(InputError, match="pass --quoting none") as info:
        _plan(path)
    assert info.value.line == 2 and "in.tsv" in str(info.value)


def test_quoting_none_keeps_one_record_per_line(tmp_path: Path) -> None:
    """A quote never opens a field that runs on over the next line."""
    path = tmp_path / "in.tsv"
    path.write_bytes(_tsv([("1", '"opened'), ("2", 'closed"')]))
    assert _read(_plan(path, quoting="none")) == [("1", '"opened'), ("2", 'closed"')]


def test_the_settings_hand_quoting_and_normalize_to_planning() -> None:
    settings = RunSettings(input="x.csv", quoting="none", normalize="NFKC")
    assert settings.plan_arguments["quoting"] == "none"
    assert settings.plan_arguments["normalize"] == "NFKC"
    with pytest.raises(ValueError):
        RunSettings(input="x.csv", quoting="all")  # type: ignore[arg-type]


# -- sep= ------------------------------------------------------------------------------------


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["no-bom", "bom"])
def test_an_excel_sep_line_names_the_delimiter_and_is_not_the_header(
    tmp_path: Path, newline: str, bom: bytes
) -> None:
    lines = ["sep=;", "id;title;text", "1;t;first, with a comma", "2;t;second", "3;t;third"]
    path = tmp_path / "excel.csv"
    path.write_bytes(bom + newline.join(lines).encode("utf-8") + newline.encode())
    fmt = check_header(path, id_column="id", text_column="text", codec="auto", delimiter="auto")
    assert fmt.delimiter == ";" and fmt.sep_line and "sep=" in fmt.note
    plan = _plan(path)
    assert plan.source.delimiter == ";"
    assert _read(plan) == [("1", "first, with a comma"), ("2", "second"), ("3", "third")]
    assert plan.chunks[0].line_start == 3  # sep= is line 1, the header line 2


def test_a_sep_line_with_only_a_header_names_line_3(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b"sep=;\nid;text\n")
    with pytest.raises(InputError, match="no data rows") as info:
        _plan(path)
    assert info.value.line == 3


def test_a_sep_line_header_error_names_line_2(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b"sep=;\nkey;text\n1;x\n")
    with pytest.raises(InputError, match="no id column 'id'") as info:
        _plan(path)
    assert info.value.line == 2


def test_a_delimiter_that_contradicts_the_sep_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b"sep=;\nid;text\n1;x\n")
    with pytest.raises(InputError, match="names ';' but --delimiter is ','") as info:
        _plan(path, delimiter=",")
    assert info.value.line == 1
    assert _read(_plan(path, delimiter=";")) == [("1", "x")]


# -- a repeated header -----------------------------------------------------------------------


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["no-bom", "bom"])
@pytest.mark.parametrize("quoted", [False, True], ids=["bare", "quoted"])
def test_two_exports_joined_with_cat_are_refused_naming_the_second_header(
    tmp_path: Path, bom: bytes, quoted: bool
) -> None:
    header = b'"id","text"\n' if quoted else b"id,text\n"
    first = b"\xef\xbb\xbf" + header + b"1,one\nid,only starts like the header\n"
    second = bom + header + b"3,three\n"
    path = tmp_path / "joined.csv"
    path.write_bytes(first + second)  # cat a.csv b.csv
    with pytest.raises(InputError, match="repeats the header") as info:
        _plan(path, chunk_size=1)
    message = str(info.value)
    assert info.value.line == 4 and "joined.csv" in message  # line 3 is data
    assert ("byte-order mark" in message) == bool(bom)
    assert "sed -i '4d'" in message and "tail -n +2" in message
    assert info.value.exit_code == 2


def test_a_repeated_header_is_refused_under_quoting_none(tmp_path: Path) -> None:
    path = tmp_path / "joined.tsv"
    path.write_bytes(_tsv(LITERAL[:2]) + b"\xef\xbb\xbf" + _tsv(LITERAL[2:]))
    with pytest.raises(InputError, match="repeats the header after a byte-order mark") as info:
        _plan(path, quoting="none")
    assert info.value.line == 4


def test_a_second_excel_sep_line_is_refused(tmp_path: Path) -> None:
    export = b"sep=;\nid;title;text\n1;t;x\n"
    path = tmp_path / "joined.csv"
    path.write_bytes(export + export.replace(b"1;", b"2;"))
    with pytest.raises(InputError, match="'sep=' line again") as info:
        _plan(path)
    assert info.value.line == 4
    # the advice removes the second export's sep= line and its header, and then reads
    message = str(info.value)
    assert "sed -i '4,5d'" in message and "tail -n +3" in message
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3] + lines[5:]))  # what sed -i '4,5d' leaves
    assert _plan(path).rows == 2


# -- --normalize -----------------------------------------------------------------------------

TEXTS = ["café crème", "Ångström", "ﬁne ＡＢＣ"]


def _export(tmp_path: Path, name: str, form: str) -> Path:
    path = tmp_path / name
    rows = [(str(i), unicodedata.normalize(form, t)) for i, t in enumerate(TEXTS)]
    path.write_bytes(_tsv(rows))
    return path


@pytest.mark.parametrize("form", ["NFC", "NFKC"])
def test_normalize_gives_nfd_and_nfc_exports_the_same_texts_and_keys(
    tmp_path: Path, form: str
) -> None:
    nfd = _plan(_export(tmp_path, "nfd.tsv", "NFD"), normalize=form)
    nfc = _plan(_export(tmp_path, "nfc.tsv", "NFC"), normalize=form)
    assert nfd.sha256 != nfc.sha256  # other bytes
    expected = [(str(i), unicodedata.normalize(form, t)) for i, t in enumerate(TEXTS)]
    assert _read(nfd) == _read(nfc) == expected
    assert [c.key for c in nfd.chunks] == [c.key for c in nfc.chunks]
    assert nfd.source.normalize == form
    row = read_chunk(nfd.source, nfd.chunks[0])[0]
    assert row.text_sha256 == text_sha256(expected[0][1])


def test_normalize_applies_to_a_composed_template(tmp_path: Path) -> None:
    path = tmp_path / "in.tsv"
    decomposed = unicodedata.normalize("NFD", "é")
    path.write_bytes(f"id\ttitle\ttext\n1\t{decomposed}\t{decomposed}\n".encode())
    plan = _plan(path, text_template="{title}: {text}", normalize="NFC")
    assert _read(plan) == [("1", "é: é")]


def test_truncated_texts_are_read_and_hashed_cut_and_the_cut_enters_the_keys(
    tmp_path: Path,
) -> None:
    """--on-too-long truncate: planning and the chunk reader take the same cut text (30
    bytes for --max-input-tokens 10, a 2-byte character never split), and its hash."""
    path = tmp_path / "in.csv"
    path.write_text("id,text\n1," + "é" * 100 + "\n2,short\n", encoding="utf-8")
    settings = RunSettings(
        input=str(path), embedder="openai", max_input_tokens=10, on_too_long="truncate"
    )
    assert settings.plan_arguments["truncate_bytes"] == 30
    dead_letter = settings.model_copy(update={"on_too_long": "dead-letter"})
    local = settings.model_copy(update={"embedder": "local"})  # the model truncates itself
    assert dead_letter.truncate_bytes is None and local.truncate_bytes is None
    # a truncation that would do nothing is refused, not ignored
    for fields, named in (
        ({"on_too_long": "truncate"}, "needs --max-input-tokens"),
        ({"embedder": "local", "max_input_tokens": 10}, "omit --max-input-tokens"),
    ):
        with pytest.raises(ValueError, match=named):
            RunSettings(input="x.csv", **fields)  # type: ignore[arg-type]
    plan = _plan(path, truncate_bytes=30)
    assert _read(plan) == [("1", "é" * 15), ("2", "short")]
    rows = read_chunk(plan.source, plan.chunks[0])
    assert [r.text_sha256 for r in rows] == [text_sha256("é" * 15), text_sha256("short")]
    assert plan.source.key_lines == ["truncate:30"]
    whole = _plan(path)
    assert whole.chunks[0].key != plan.chunks[0].key and _read(whole)[0][1] == "é" * 100


def test_a_normalization_form_enters_the_keys_and_none_leaves_them(tmp_path: Path) -> None:
    assert columns_lines(None) == columns_lines(None, normalize="none") == []
    assert columns_lines("{a}{b}", ("k",), True, "NFC") == [
        'template:"{a}{b}"',
        'keep:["k"]',
        "keep_text",
        "normalize:NFC",
    ]
    path = _export(tmp_path, "nfc.tsv", "NFC")
    keys = {form: [c.key for c in _plan(path, normalize=form).chunks] for form in ("none", "NFC")}
    assert keys["none"] != keys["NFC"]  # same texts, other settings: another key
    nfd = _plan(_export(tmp_path, "nfd.tsv", "NFD"), normalize="none")
    assert [c.key for c in nfd.chunks] != keys["none"]  # none: hashed as read
    assert _read(nfd)[0][1] == unicodedata.normalize("NFD", TEXTS[0])
    plain = RunSettings(input="x.csv").plan_arguments
    assert plain["normalize"] == "none" and plain["truncate_bytes"] is None
    assert RunSettings(input="x.csv", normalize="NFC").plan_arguments["normalize"] == "NFC"
    assert _plan(path, normalize="NFC").source.key_lines == ["normalize:NFC"]
