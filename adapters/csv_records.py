"""Reading CSV records: records cut by the standard library's ``csv`` reader from the
physical lines of ``adapters.csv_lines``, and the checks every record meets.

Records versus lines: a quoted field may hold line breaks, so chunks are cut by records;
``row_number`` counts records (1-based, header excluded) and ``line`` counts physical lines
(1-based, header = line 1). Lines are split on the encoded newline: the byte 0x0A for UTF-8
and legacy encodings such as cp932 (0x0A is never a trail byte); the 2-byte unit ``0A 00``
at an even offset for UTF-16-LE (``00 0A`` for BE); ``\r`` for files with CR-only line ends
(classic Mac, some exports). The format comes from ``adapters.csv_format``; ``open_lines``
picks the line reader (``Blocks`` where it reads alike, else ``Lines``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from adapters.csv_format import CsvFormat
from adapters.csv_lines import Blocks, Hashes, Lines, LineSource, block_decodable
from embedline.errors import InputError

__all__ = ["Header", "check_width", "open_lines", "parse_header", "read_records", "row_id_of"]

_MAX_FIELD_CHARS = 64 * 1024 * 1024  # csv's default limit (131,072 chars) is too small for texts


def read_records(
    lines: LineSource, path: str, delimiter: str = ","
) -> Iterator[tuple[int, int, list[str]]]:
    """Yield ``(line, last_line, fields)`` for each non-blank record: the physical lines
    where it starts and ends, and its fields as written.

    While a record is yielded, ``last_line`` is the last line ``lines`` has read, so
    ``lines.offset_after(last_line)`` is the byte offset just after the record.

    Sets the process's csv field limit first: every path that reads CSV comes through here,
    including a chunk task in a fresh worker process (Dask), where the default limit of
    131,072 characters would refuse a long text that planning accepted.

    :raises InputError: a malformed record (naming the line where it starts), or what
        ``lines`` raises.
    """
    csv.field_size_limit(_MAX_FIELD_CHARS)
    reader = csv.reader(lines, strict=True, delimiter=delimiter)
    base = lines.first_line - 1
    line = lines.first_line  # where the next record starts
    try:
        for fields in reader:
            last_line = base + reader.line_num
            if fields:  # csv yields [] for a blank line; blank lines are skipped
                yield line, last_line, fields
            line = last_line + 1
    except csv.Error as exc:
        raise InputError(
            f"malformed CSV record ({exc}); check the quotes of the record starting here",
            path=path,
            line=line,
        ) from None


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
) -> Header:
    """Find the id and text columns in the header record ``fields``; with a text template,
    the columns it names (``template_columns``) instead of ``text_column``; and the
    ``keep_columns``.

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
                line=1,
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
                line=1,
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
) -> LineSource:
    """Skip ``fh``'s BOM (hashing it, with ``hashes``) and wrap the rest in a line reader:
    ``Blocks`` if ``fast`` and ``block_decodable`` for ``fmt``, else ``Lines``. ``line`` lines
    and ``offset`` bytes of the input lie before ``fh``'s start (a chunk read).

    Whoever reads ``Blocks`` catches ``csv_lines.NeedsLineReader`` and reads again with
    ``fast=False``, for the exact error.
    """
    bom = fh.read(fmt.bom)
    if hashes is not None:
        hashes.file.update(bom)
    offset += len(bom)
    if fast and block_decodable(fmt.codec, fmt.newline):
        return Blocks(fh, codec=fmt.codec, line=line, offset=offset, hashes=hashes)
    return Lines(
        fh,
        codec=fmt.codec,
        path=source_path,
        line=line,
        offset=offset,
        hashes=hashes,
        newline=fmt.newline,
    )
