"""Reading CSV records: physical lines with their numbers and byte offsets, records cut
from them by the standard library's ``csv`` reader, and the checks every record meets.

Records versus lines: a quoted field may hold line breaks, so chunks are cut by records;
``row_number`` counts records (1-based, header excluded) and ``line`` counts physical lines
(1-based, header = line 1). Lines are split on the encoded newline and decoded strictly one by
one: the byte 0x0A for UTF-8 and legacy encodings such as cp932 (0x0A is never a trail byte);
the 2-byte unit ``0A 00`` at an even offset for UTF-16-LE (``00 0A`` for BE); ``\r`` for files
with CR-only line ends (classic Mac, some exports). The format comes from
``adapters.csv_format``.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from adapters.csv_format import CsvFormat
from embedline.errors import InputError

__all__ = ["Header", "Lines", "Record", "check_width", "open_lines", "parse_header",
           "read_records", "row_id_of"]

_BLOCK = 1 << 20
_MAX_FIELD_CHARS = 64 * 1024 * 1024  # csv's default limit (131,072 chars) is too small for texts


class Lines:
    """Iterator of decoded physical lines that knows its line number and byte offset.

    ``line`` is the number of the last line yielded; ``offset`` the byte offset just after
    it. Every raw line is passed to ``on_bytes`` (hashing) before decoding.
    """

    def __init__(
        self,
        fh: BinaryIO,
        *,
        codec: str,
        path: str,
        line: int,
        offset: int,
        on_bytes: Callable[[bytes], None] | None = None,
        newline: str = "\n",
    ) -> None:
        self._fh = fh
        self._codec = codec
        self._path = path
        self.line = line
        self.offset = offset
        self.on_bytes = on_bytes
        separator = newline.encode(codec)
        if separator == b"\n":
            self._raw: Iterator[bytes] = iter(fh.readline, b"")  # the fast path, in C
        else:
            self._raw = _split_lines(fh, separator, unit=_unit(codec))

    def __iter__(self) -> Lines:
        return self

    def __next__(self) -> str:
        raw = next(self._raw, b"")
        if not raw:
            raise StopIteration
        self.line += 1
        self.offset += len(raw)
        if self.on_bytes is not None:
            self.on_bytes(raw)
        try:
            return raw.decode(self._codec)
        except UnicodeDecodeError as exc:
            raise InputError(
                f"byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of this line is not valid "
                f"{self._codec}; pass --encoding with the file's real encoding (e.g. cp932) "
                "or re-save the file as UTF-8",
                path=self._path,
                line=self.line,
            ) from None


def _unit(codec: str) -> int:
    """Bytes per code unit: where a line break may start (2 for UTF-16)."""
    return len("\n".encode(codec))


def _split_lines(fh: BinaryIO, separator: bytes, *, unit: int) -> Iterator[bytes]:
    """Yield ``fh``'s lines, each with its ``separator``, which counts only at an offset that
    is a multiple of ``unit`` (so UTF-16's ``0A 00`` never matches across two characters)."""
    buf = b""
    while True:
        block = fh.read(_BLOCK)
        if not block:
            if buf:
                yield buf
            return
        buf += block
        pos = search = 0
        while (found := buf.find(separator, search)) >= 0:
            if (found - pos) % unit:
                search = found + 1
                continue
            end = found + len(separator)
            yield buf[pos:end]
            pos = search = end
        buf = buf[pos:]


@dataclass(slots=True)
class Record:
    """One non-blank CSV record: its fields as written, and where it lies in the file."""

    fields: list[str]
    line: int  # physical line where the record starts
    start: int  # byte offset of the record's first line
    stop: int  # byte offset just after its last line


def read_records(lines: Lines, path: str, delimiter: str = ",") -> Iterator[Record]:
    """Yield non-blank records with their first line and byte span.

    Sets the process's csv field limit first: every path that reads CSV comes through here,
    including a chunk task in a fresh worker process (Dask), where the default limit of
    131,072 characters would refuse a long text that planning accepted.
    """
    csv.field_size_limit(_MAX_FIELD_CHARS)
    reader = csv.reader(lines, strict=True, delimiter=delimiter)
    while True:
        start, first_line = lines.offset, lines.line + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InputError(
                f"malformed CSV record ({exc}); check the quotes of the record starting here",
                path=path,
                line=first_line,
            ) from None
        if fields:  # csv yields [] for a blank line; blank lines are skipped
            yield Record(fields, first_line, start, lines.offset)


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


def parse_header(fields: list[str], *, id_column: str, text_column: str, path: str,
                 template_columns: Sequence[str] = (),
                 keep_columns: Sequence[str] = ()) -> Header:
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
            what = {"id": "no id column", "text": "no text column",
                    "template": f"no column named by {flag}",
                    "kept": f"no column named by {flag}"}[role]
            raise InputError(
                f"{what} {column!r} in the header; columns found: {found}. "
                + ("Pass --id-column with one of them" if role == "id" else
                   "Pass --text-column (or --text-template '{column}') with one of them"
                   if role == "text" else
                   f"Check {flag}: names are matched exactly, case included (a "
                   "placeholder is a column name only: no format specs)"),
                path=path,
                line=1,
                column=column,
            )
    last_named = max(i for i, name in enumerate(fields) if name)
    text_index = seen[template_columns[0] if template_columns else text_column]
    columns = {c: seen[c] for c in (*template_columns, *keep_columns)}
    return Header(fields, seen[id_column], text_index, last_named + 1, columns)


def check_width(record: Record, header: Header, path: str) -> None:
    """:raises InputError: ``record`` lacks a field up to the last named column, or has
    extra non-empty fields (an unquoted comma)."""
    width, expected = len(record.fields), len(header.names)
    if width < header.min_fields:
        raise InputError(
            f"record has {width} fields but the header has {expected}; a field may be missing "
            "or a quote left open on an earlier line",
            path=path,
            line=record.line,
        )
    if width > expected and any(record.fields[expected:]):
        raise InputError(
            f"record has {width} fields but the header has {expected}; quote fields that "
            "contain commas",
            path=path,
            line=record.line,
        )


def row_id_of(record: Record, header: Header, path: str) -> str:
    """Return ``record``'s id, exactly as written.

    :raises InputError: the id is empty (or whitespace) or holds U+001F (a key separator).
    """
    row_id = record.fields[header.id_index]
    column = header.names[header.id_index]
    if not row_id.strip():
        raise InputError(
            f"empty id in column {column!r}; every row needs a unique id",
            path=path,
            line=record.line,
            column=column,
        )
    if "\x1f" in row_id:
        raise InputError(
            f"id in column {column!r} contains the control character U+001F, which keys use "
            "as a separator",
            path=path,
            line=record.line,
            column=column,
        )
    return row_id


def open_lines(
    fh: BinaryIO, source_path: str, fmt: CsvFormat, on_bytes: Callable[[bytes], None] | None
) -> Lines:
    """Skip ``fh``'s BOM (hashing it) and wrap the rest in ``fmt``'s line reader."""
    bom = fh.read(fmt.bom)
    if on_bytes is not None and bom:
        on_bytes(bom)
    return Lines(fh, codec=fmt.codec, path=source_path, line=0, offset=fmt.bom,
                  on_bytes=on_bytes, newline=fmt.newline)
