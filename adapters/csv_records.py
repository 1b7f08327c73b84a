"""Reading CSV records: records cut by the standard library's ``csv`` reader from the
physical lines of ``adapters.csv_lines``, and the checks every record meets.

Records versus lines: a quoted field may hold line breaks, so chunks are cut by records;
``row_number`` counts records (1-based, header excluded) and ``line`` counts physical lines
(1-based, header = line 1). Lines are split on the encoded newline: the byte 0x0A for UTF-8
and legacy encodings such as cp932 (0x0A is never a trail byte); the 2-byte unit ``0A 00``
at an even offset for UTF-16-LE (``00 0A`` for BE); ``\r`` for files with CR-only line ends
(classic Mac, some exports). The format comes from ``adapters.csv_format``; ``open_lines``
picks the line reader (``Blocks`` where it reads alike, else ``Lines``).

With ``--quoting none`` (``CsvFormat.quoting``) a record is one physical line split on the
delimiter only, and quotes are kept as written. The header is the first record, or the
second after Excel's ``sep=X`` line (``read_header``); the header again among the data
(two exports joined with ``cat``, with or without the second one's BOM) is refused
(``refuse_repeated_header``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from adapters.csv_format import QUOTING, CsvFormat
from adapters.csv_lines import Blocks, Hashes, Lines, LineSource, block_decodable
from embedline.errors import InputError

__all__ = [
    "Header",
    "check_width",
    "header_starts",
    "open_lines",
    "parse_header",
    "read_header",
    "read_records",
    "refuse_repeated_header",
    "row_id_of",
]

_MAX_FIELD_CHARS = 64 * 1024 * 1024  # csv's default limit (131,072 chars) is too small for texts


def read_records(
    lines: LineSource, path: str, delimiter: str = ",", quoting: str = "minimal"
) -> Iterator[tuple[int, int, list[str]]]:
    """Yield ``(line, last_line, fields)`` for each non-blank record: the physical lines
    where it starts and ends, and its fields as written. ``quoting`` is a
    ``csv_format.QUOTING`` name (``none``: quotes are literal, a record is one line).

    While a record is yielded, ``last_line`` is the last line ``lines`` has read, so
    ``lines.offset_after(last_line)`` is the byte offset just after the record.

    Sets the process's csv field limit first: every path that reads CSV comes through here,
    including a chunk task in a fresh worker process (Dask), where the default limit of
    131,072 characters would refuse a long text that planning accepted.

    :raises InputError: a malformed record (naming the line where it starts), or what
        ``lines`` raises.
    """
    csv.field_size_limit(_MAX_FIELD_CHARS)
    reader = csv.reader(lines, strict=True, delimiter=delimiter, quoting=QUOTING[quoting])
    base = lines.first_line - 1
    line = lines.first_line  # where the next record starts
    try:
        for fields in reader:
            last_line = base + reader.line_num
            if fields:  # csv yields [] for a blank line; blank lines are skipped
                yield line, last_line, fields
            line = last_line + 1
    except csv.Error as exc:
        hint = (
            "; if this file's quotes are literal characters (a plain TSV, a database "
            "dump), pass --quoting none"
            if quoting == "minimal"
            else ""
        )
        raise InputError(
            f"malformed CSV record ({exc}); check the quotes of the record starting here{hint}",
            path=path,
            line=line,
        ) from None


def read_header(
    records: Iterator[tuple[int, int, list[str]]], fmt: CsvFormat, path: str
) -> tuple[int, int, list[str]]:
    """The header record of ``records`` (``read_records`` from the input's start): the
    first record, or the second when the first line is Excel's ``sep=X`` (``fmt.sep_line``).

    :raises InputError: the file holds no header.
    """
    first = next(records, None)
    if first is not None and fmt.sep_line:
        first = next(records, None)
    if first is None:
        raise InputError(
            "the file is empty: expected a header line",
            path=path,
            line=2 if fmt.sep_line else 1,
        )
    return first


def header_starts(header: Header) -> frozenset[str]:
    """First fields that make a data record worth ``refuse_repeated_header``'s look: the
    header's first name (bare, quoted, after a BOM) and Excel's ``sep=`` line. One set
    lookup per record is all the planning loop pays."""
    first = header.names[0]
    starts = {first, f'"{first}"', "sep="}
    return frozenset(starts | {"\ufeff" + s for s in starts})


def refuse_repeated_header(fields: list[str], line: int, header: Header, path: str) -> None:
    """:raises InputError: the record ``fields`` starting at ``line`` is the header again
    (with or without a BOM before it), or Excel's ``sep=`` line: two exports joined into one
    file (``cat a.csv b.csv``). Refused rather than skipped: the join was likely an accident
    and the user decides; skipped, its fields would never be seen, embedded, they would be
    a row named after the id column."""
    first = fields[0]
    bom = first.startswith("\ufeff")
    first = first.removeprefix("\ufeff")
    names = header.names
    if first == "sep=" and not any(fields[1:]):
        # the second export's header follows its sep= line: both go
        what, lines, skip = "is Excel's 'sep=' line again, before a second header", 2, 3
    elif first in (names[0], f'"{names[0]}"') and fields[1:] == names[1:]:
        what = "repeats the header" + (" after a byte-order mark" if bom else "")
        lines, skip = 1, 2
    else:
        return
    span = f"{line}d" if lines == 1 else f"{line},{line + lines - 1}d"
    raise InputError(
        f"line {line} {what}: two exports joined into one file (cat a.csv b.csv)? "
        "Embedded, it would be a row like any other. Remove it (sed -i "
        f"'{span}' FILE; or join exports with the header once: tail -n +{skip} b.csv >> a.csv)",
        path=path,
        line=line,
    )


@dataclass(frozen=True, slots=True)
class Header:
    """The header's column names and the positions of the id and text columns.

    ``text_index`` is the text column's position (with a template: its first column's);
    ``columns`` maps every column the template or ``--keep-columns`` names to its position.
    """

    names: list[str]
    id_index: int
    text_index: int
    min_fields: int  # a row needs every field up to the last named column
    columns: dict[str, int] = field(default_factory=dict)


def parse_header(
    fields: list[str],
    *,
    id_column: str,
    text_column: str,
    path: str,
    template_columns: Sequence[str] = (),
    keep_columns: Sequence[str] = (),
    line: int = 1,
) -> Header:
    """Find the id and text columns in the header record ``fields`` (at physical ``line``);
    with a text template, the columns it names (``template_columns``) instead of
    ``text_column``; and the ``keep_columns``.

    :raises InputError: a column named twice, the same column for id and text, or any
        column missing (naming it and listing the columns found).
    """
    seen: dict[str, int] = {}
    for position, name in enumerate(fields):
        if name and name in seen:
            raise InputError(
                f"column {name!r} appears twice in the header (fields {seen[name] + 1} and "
                f"{position + 1}); rename one so the column to read is unambiguous",
                path=path,
                line=line,
                column=name,
            )
        seen[name] = position
    if not template_columns and id_column == text_column:
        raise InputError("--id-column and --text-column must name different columns", path=path)
    wanted = [("id", id_column, "--id-column")]
    if template_columns:
        wanted += [("template", c, "--text-template") for c in template_columns]
    else:
        wanted.append(("text", text_column, "--text-column"))
    wanted += [("kept", c, "--keep-columns") for c in keep_columns]
    for role, column, flag in wanted:
        if column not in seen:
            found = ", ".join(repr(n) for n in fields)
            what = {
                "id": "no id column",
                "text": "no text column",
                "template": f"no column named by {flag}",
                "kept": f"no column named by {flag}",
            }[role]
            raise InputError(
                f"{what} {column!r} in the header; columns found: {found}. "
                + (
                    _one_column_hint(fields)
                    or (
                        "Pass --id-column with one of them"
                        if role == "id"
                        else "Pass --text-column (or --text-template '{column}') with one of them"
                        if role == "text"
                        else f"Check {flag}: names are matched exactly, case included"
                        + (
                            " (a placeholder is a column name only: no format specs)"
                            if role == "template"
                            else ""
                        )
                    )
                ),
                path=path,
                line=line,
                column=column,
            )
    last_named = max(i for i, name in enumerate(fields) if name)
    text_index = seen[template_columns[0] if template_columns else text_column]
    columns = {c: seen[c] for c in (*template_columns, *keep_columns)}
    return Header(fields, seen[id_column], text_index, last_named + 1, columns)


def _one_column_hint(fields: list[str]) -> str | None:
    """What to say when the header read as one column that holds a usual delimiter: the
    delimiter is wrong (``--delimiter`` named another, or auto found none), not the
    column's name."""
    if len(fields) != 1:
        return None
    inside = [
        name
        for d, name in ((",", "','"), (";", "';'"), ("\t", "tab"), ("|", "'|'"))
        if d in fields[0]
    ]
    if not inside:
        return None
    return (
        f"The header read as one column, and it holds {inside[0]}: check --delimiter "
        f"(auto finds , ; tab |; pass --delimiter {inside[0]})"
    )


def check_width(fields: list[str], line: int, header: Header, path: str) -> None:
    """:raises InputError: the record ``fields`` starting at ``line`` lacks a field up to the
    last named column, or has extra non-empty fields (an unquoted comma)."""
    width, expected = len(fields), len(header.names)
    if width < header.min_fields:
        raise InputError(
            f"record has {width} fields but the header has {expected}; a field may be missing "
            "or a quote left open on an earlier line",
            path=path,
            line=line,
        )
    if width > expected and any(fields[expected:]):
        raise InputError(
            f"record has {width} fields but the header has {expected}; quote fields that "
            "contain commas",
            path=path,
            line=line,
        )


def row_id_of(fields: list[str], line: int, header: Header, path: str) -> str:
    """Return the id of the record ``fields`` starting at ``line``, exactly as written.

    :raises InputError: the id is empty (or whitespace) or holds U+001F (a key separator).
    """
    row_id = fields[header.id_index]
    column = header.names[header.id_index]
    if not row_id.strip():
        raise InputError(
            f"empty id in column {column!r}; every row needs a unique id",
            path=path,
            line=line,
            column=column,
        )
    if "\x1f" in row_id:
        raise InputError(
            f"id in column {column!r} contains the control character U+001F, which keys use "
            "as a separator",
            path=path,
            line=line,
            column=column,
        )
    return row_id


def open_lines(
    fh: BinaryIO,
    source_path: str,
    fmt: CsvFormat,
    *,
    hashes: Hashes | None = None,
    fast: bool = True,
    line: int = 0,
    offset: int = 0,
    blocks: type[Blocks] = Blocks,
) -> LineSource:
    """Skip ``fh``'s BOM (hashing it, with ``hashes``) and wrap the rest in a line reader:
    ``blocks`` (``Blocks`` or a subclass) if ``fast`` and ``block_decodable`` for ``fmt``,
    else ``Lines``. ``line`` lines and ``offset`` bytes of the input lie before ``fh``'s
    start (a chunk read).

    Whoever reads ``Blocks`` catches ``csv_lines.NeedsLineReader`` and reads again with
    ``fast=False``, for the exact error.
    """
    bom = fh.read(fmt.bom)
    if hashes is not None:
        hashes.file.update(bom)
    offset += len(bom)
    if fast and block_decodable(fmt.codec, fmt.newline):
        return blocks(fh, codec=fmt.codec, line=line, offset=offset, hashes=hashes)
    return Lines(
        fh,
        codec=fmt.codec,
        path=source_path,
        line=line,
        offset=offset,
        hashes=hashes,
        newline=fmt.newline,
    )
