"""Planning and reading the CSV: records not lines, strings exactly as written, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.csv_chunks import read_chunk
from adapters.csv_source import plan_csv
from embedline import keys
from embedline.errors import InputError
from embedline.models import InputPlan, Row
from embedline.template import kept_sha256


def _plan(path: Path, *, chunk_size: int = 2, codec: str = "utf-8", **kw: str) -> InputPlan:
    return plan_csv(
        path,
        id_column=kw.get("id_column", "id"),
        text_column=kw.get("text_column", "text"),
        codec=codec,
        chunk_size=chunk_size,
        model="m",
        dimensions=None,
    )


def _rows(plan: InputPlan) -> list[list[Row]]:
    return [read_chunk(plan.source, spec) for spec in plan.chunks]


def _write(tmp_path: Path, data: bytes | str, name: str = "in.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_ids_that_look_numeric_stay_exact_strings_in_every_chunk(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text\n007,a\n010,b\nA12,c\n013,d\n")
    plan = _plan(path, chunk_size=2)
    chunks = _rows(plan)
    assert [[r.id for r in rows] for rows in chunks] == [["007", "010"], ["A12", "013"]]
    assert plan.rows == 4 and len(plan.chunks) == 2


def test_bom_crlf_and_quoted_header(tmp_path: Path) -> None:
    path = _write(tmp_path, b'\xef\xbb\xbf"id","text"\r\n"001","hello"\r\n"002","x"\r\n')
    plan = _plan(path, chunk_size=1)
    assert plan.source.id_index == 0 and plan.source.text_index == 1
    rows = _rows(plan)
    assert rows[0][0].id == "001" and rows[0][0].text == "hello"
    assert rows[1][0].id == "002"
    assert plan.bytes == path.stat().st_size


def test_quoted_crlf_and_doubled_quotes_are_one_record_each(tmp_path: Path) -> None:
    data = 'id,text\r\n1,"line one\r\nline two"\r\n2,"He said ""hi"", then left"\r\n3,plain\r\n'
    path = _write(tmp_path, data)
    plan = _plan(path, chunk_size=2)
    assert plan.rows == 3
    assert [c.rows for c in plan.chunks] == [2, 1]
    rows = [r for chunk in _rows(plan) for r in chunk]
    assert rows[0].text == "line one\r\nline two"
    assert rows[1].text == 'He said "hi", then left'
    assert [r.row_number for r in rows] == [1, 2, 3]
    assert [r.line for r in rows] == [2, 4, 5]  # physical lines: record 1 spans lines 2-3
    assert plan.chunks[1].line_start == 5


def test_error_names_physical_line_after_multiline_records(tmp_path: Path) -> None:
    path = _write(tmp_path, 'id,text\n1,"a\nb\nc"\n,empty id\n')
    with pytest.raises(InputError) as info:
        _plan(path)
    assert info.value.line == 5 and f"{path}:5" in str(info.value)
    assert "empty id" in str(info.value) and "'id'" in str(info.value)


@pytest.mark.parametrize(
    ("row_id", "words"),
    [("   ", "empty id"), ("\u3000", "empty id"), ("\t ", "empty id"), ("a\x1fb", "U+001F")],
)
def test_every_id_the_rule_refuses_is_refused_by_planning_naming_its_line(
    tmp_path: Path, row_id: str, words: str
) -> None:
    path = _write(tmp_path, f'id,text\n1,a\n"{row_id}",b\n')
    with pytest.raises(InputError) as info:
        _plan(path)
    assert info.value.line == 3 and words in str(info.value)


def test_whitespace_only_texts_are_planned_empty_as_the_embed_rule_says(tmp_path: Path) -> None:
    from adapters.row_facts import chunk_rows
    from adapters.scratch import release

    texts = ["x", "  ", "\u3000\u2003", " y ", '"\n"', "\t"]
    body = "".join(f"{i},{t}\n" for i, t in enumerate(texts))
    plan = plan_csv(
        _write(tmp_path, "id,text\n" + body),
        id_column="id",
        text_column="text",
        codec="utf-8",
        chunk_size=10,
        model="m",
        dimensions=None,
        scratch_root=str(tmp_path / "scratch"),
    )
    try:
        empty = chunk_rows(str(plan.scratch), 0).column("empty").to_pylist()
    finally:
        release(plan.scratch)
    rows = read_chunk(plan.source, plan.chunks[0])
    assert empty == [not row.text.strip() for row in rows] == [False, True, True, False, True, True]


def test_trailing_comma_on_every_row_does_not_shift_columns(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text\n1,alpha,\n2,beta,\n")
    rows = [r for chunk in _rows(_plan(path)) for r in chunk]
    assert [(r.id, r.text) for r in rows] == [("1", "alpha"), ("2", "beta")]


def test_extra_non_empty_field_is_an_input_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text\n1,alpha\n2,beta,gamma\n")
    with pytest.raises(InputError, match="3 fields but the header has 2") as info:
        _plan(path)
    assert info.value.line == 3


def test_missing_field_is_an_input_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,title,text\n1,t,alpha\n2,only-two\n")
    with pytest.raises(InputError, match="2 fields but the header has 3") as info:
        _plan(path)
    assert info.value.line == 3


def test_header_with_text_twice_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text,text\n1,a,b\n")
    with pytest.raises(InputError, match="'text' appears twice") as info:
        _plan(path)
    assert info.value.line == 1 and info.value.column == "text"


def test_missing_column_lists_columns_found(tmp_path: Path) -> None:
    path = _write(tmp_path, "key,body\n1,a\n")
    with pytest.raises(InputError) as info:
        _plan(path)
    message = str(info.value)
    assert "no id column 'id'" in message and "'key', 'body'" in message
    assert "--id-column" in message


def test_na_like_texts_are_real_text(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text\n1,NA\n2,null\n3,None\n4,n/a\n5,\n")
    rows = [r for chunk in _rows(_plan(path, chunk_size=10)) for r in chunk]
    assert [r.text for r in rows] == ["NA", "null", "None", "n/a", ""]


def test_duplicate_ids_are_reported_with_their_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text\nx,1\ny,2\nx,3\nz,4\ny,5\n")
    with pytest.raises(InputError) as info:
        _plan(path)
    message = str(info.value)
    assert "2 duplicated id(s)" in message
    assert "'x' at lines 2, 4" in message and "'y' at lines 3, 6" in message


def test_undecodable_byte_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, b"id,text\n1,ok\n2,caf\xe9\n")
    with pytest.raises(InputError, match=r"0xe9.*not valid utf-8.*--encoding") as info:
        _plan(path)
    assert info.value.line == 3


def test_cp932_file_keeps_every_character(tmp_path: Path) -> None:
    text = "①㈱髙～テスト"
    path = _write(tmp_path, f"id,text\n1,{text}\n".encode("cp932"))
    rows = _rows(_plan(path, codec="cp932"))
    assert rows[0][0].text == text
    assert "\uff5e" in rows[0][0].text  # the full-width tilde stays U+FF5E


def test_utf16_file_is_refused_with_advice(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text\n1,a\n".encode("utf-16"))
    with pytest.raises(InputError, match="UTF-16"):
        _plan(path)


def test_unclosed_quote_is_a_malformed_record(tmp_path: Path) -> None:
    path = _write(tmp_path, 'id,text\n1,ok\n2,"never closed\n3,x\n')
    with pytest.raises(InputError, match="malformed CSV record") as info:
        _plan(path)
    assert info.value.line == 3


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="empty"):
        _plan(_write(tmp_path, ""))
    with pytest.raises(InputError, match="cannot open"):
        _plan(tmp_path / "nope.csv")


def test_chunks_cover_every_record_once_and_keys_match_their_rows(tmp_path: Path) -> None:
    lines = [f'{i},"text {i}\nsecond line"' for i in range(23)]
    path = _write(tmp_path, "id,text\n" + "\n".join(lines) + "\n\n\n")
    plan = _plan(path, chunk_size=5)
    chunks = _rows(plan)
    assert [len(c) for c in chunks] == [5, 5, 5, 5, 3]
    assert [r.id for c in chunks for r in c] == [str(i) for i in range(23)]
    for spec, rows in zip(plan.chunks, chunks, strict=True):
        assert spec.key == keys.chunk_key("m", None, [(r.id, r.text_sha256) for r in rows])
        assert spec.first_row == rows[0].row_number
    assert plan.chunks[-1].byte_stop == path.stat().st_size


def test_input_changed_after_planning_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "id,text\n1,alpha\n2,beta\n")
    plan = _plan(path, chunk_size=1)
    path.write_bytes(b"id,text\n1,alphx\n2,beta\n")
    with pytest.raises(InputError, match="changed while the run read it"):
        read_chunk(plan.source, plan.chunks[0])
    assert read_chunk(plan.source, plan.chunks[1])[0].id == "2"


def test_custom_columns_and_column_order(tmp_path: Path) -> None:
    path = _write(tmp_path, "body,title,key\nhello,t,k1\n")
    plan = _plan(path, id_column="key", text_column="body")
    row = _rows(plan)[0][0]
    assert (row.id, row.text) == ("k1", "hello")


def _tricky_csv(line_ending: str) -> tuple[str, list[tuple[str, str, int]]]:
    """A CSV whose records span lines in every way a real export does, with the expected
    (id, text, physical line) of each record, counted here rather than by a reader."""
    texts = [
        "plain",
        "",
        "two\nlines",
        "crlf\r\ninside",
        "lone\rcarriage return",
        "unicode line\u2028separator, form\x0cfeed, NEL\x85 and \x1cfile separator",
        'doubled ""quotes""',
        "日本語の説明\n二行目",
        "trailing newline\n",
        "a,b,c",
    ]
    out, expected, line = [f"id,text{line_ending}"], [], 2
    for i in range(37):
        text = texts[i % len(texts)]
        if i % 6 == 5:
            out.append(line_ending)  # a blank line between records
            line += 1
        quoted = '"' + text.replace('"', '""') + '"' if any(c in text for c in '\n\r",') else text
        out.append(f"r{i},{quoted}{line_ending}")
        expected.append((f"r{i}", text, line))
        line += 1 + text.count("\n")
    out.append(line_ending * 2)  # trailing blank lines
    return "".join(out), expected


@pytest.mark.parametrize("line_ending", ["\n", "\r\n"])
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 100])
def test_chunk_reads_return_each_record_with_its_first_physical_line(
    tmp_path: Path, line_ending: str, chunk_size: int
) -> None:
    data, expected = _tricky_csv(line_ending)
    plan = _plan(_write(tmp_path, data), chunk_size=chunk_size)
    rows = [row for chunk in _rows(plan) for row in chunk]
    assert [(r.id, r.text, r.line) for r in rows] == expected
    assert [r.row_number for r in rows] == list(range(1, len(expected) + 1))
    assert all(r.text_sha256 == keys.text_sha256(r.text) for r in rows)


@pytest.mark.parametrize(
    "documents",
    [
        {},
        {"text_template": "{title}\n\n{text}"},
        {"keep_columns": ("title",)},
        {"keep_text": True},
        {"text_template": "{title}: {text}", "keep_columns": ("title",), "keep_text": True},
    ],
    ids=["plain", "template", "kept", "keep-text", "all"],
)
def test_each_chunk_key_is_the_key_of_its_own_rows(
    tmp_path: Path, documents: dict[str, object]
) -> None:
    """Every documents setting: a chunk's key is ``keys.chunk_key`` of the rows read back
    (a template without kept columns once keyed every chunk as if it had no rows, so all
    chunks shared one object and the manifest did not add up)."""
    path = tmp_path / "docs.csv"
    path.write_text("id,title,text\n" + "".join(f"{n},t{n % 3},text {n}\n" for n in range(8)))
    plan = plan_csv(
        path,
        id_column="id",
        text_column="text",
        codec="auto",
        chunk_size=3,
        model="m",
        dimensions=8,
        **documents,
    )  # type: ignore[arg-type]
    kept = documents.get("keep_columns", ())
    lines = keys.columns_lines(
        documents.get("text_template"),  # type: ignore[arg-type]
        kept,
        bool(documents.get("keep_text")),
    )  # type: ignore[arg-type]
    found = []
    for spec in plan.chunks:
        rows = read_chunk(plan.source, spec)
        key_rows = [
            (
                r.id,
                keys.text_sha256(r.text),
                *([kept_sha256(list(r.kept[: len(kept)]))] if kept else []),
            )
            for r in rows
        ]
        assert spec.key == keys.chunk_key("m", 8, key_rows, lines)
        found.append(spec.key)
    assert len(set(found)) == len(plan.chunks) == 3
