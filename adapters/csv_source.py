"""The CSV source: one streaming planning pass, then each chunk reads only its own bytes.

Why the standard library's ``csv`` reader and not ``pandas.read_csv``: planning needs the byte
offset of every record boundary (so a chunk task can seek to its rows instead of re-scanning
the file) and the physical line where each record starts (for error messages). pandas gives
neither, and its type inference is the source of the classic bugs this module must not have
(``007`` read as 7, a trailing comma turning the id into the index, ``NA`` read as missing).
``csv.reader`` yields every field as the exact ``str`` written, in C, one record at a time.

Records versus lines: a quoted field may hold line breaks, so chunks are cut by records;
``row_number`` counts records (1-based, header excluded) and ``line`` counts physical lines
(1-based, header = line 1). Lines are split on the encoded newline and decoded strictly one by
one: the byte 0x0A for UTF-8 and legacy encodings such as cp932 (0x0A is never a trail byte);
the 2-byte unit ``0A 00`` at an even offset for UTF-16-LE (``00 0A`` for BE); ``\r`` for files
with CR-only line ends (classic Mac, some exports).

Format sniffing (``sniff_format``, once per input, from its first MiB): a BOM decides UTF-8 or
UTF-16; ``--encoding auto`` without a BOM takes UTF-8 if the sample decodes strictly, else the
encoding charset-normalizer names; the newline is ``\n`` unless the sample has only ``\r``;
``--delimiter auto`` tries ``,`` ``;`` TAB ``|`` on the header line and keeps the first that
yields both the id and the text column. What was chosen is reported (``CsvFormat.note``).
Compressed input (``.gz``) is decompressed as a stream by ``adapters.input_source``; a ZIP or
xlsx file, or gzip bytes without the suffix, is refused naming what it is.

Memory: the pass holds one line, one record, and 8 bytes per row (a 64-bit digest of each id,
for the duplicate check), plus the list of chunk specs.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import os
import threading
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from adapters.input_source import open_input
from embedline.errors import InputError
from embedline.keys import ChunkKeyBuilder, text_sha256
from embedline.models import ChunkSpec, InputPlan, InputSource, Row

__all__ = ["CsvFormat", "check_header", "hand_over_plan", "plan_csv", "read_chunk", "sniff_format"]

_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = {b"\xff\xfe": "utf-16-le", b"\xfe\xff": "utf-16-be"}
_SNIFF_BYTES = 1 << 20
_DELIMITERS = (",", ";", "\t", "|")
_BLOCK = 1 << 20
_MAX_FIELD_CHARS = 64 * 1024 * 1024  # csv's default limit (131,072 chars) is too small for texts
_MAX_DUPLICATES_REPORTED = 5


class _Lines:
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

    def __iter__(self) -> _Lines:
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


@dataclass(frozen=True, slots=True)
class CsvFormat:
    """How an input's bytes become records: ``codec`` decodes each line (no BOM),
    ``newline`` ends a line (``"\n"`` or ``"\r"``), ``delimiter`` separates fields, ``bom``
    bytes at the start are skipped; ``note`` says what was detected (empty: all defaults)."""

    codec: str
    newline: str = "\n"
    delimiter: str = ","
    bom: int = 0
    note: str = ""


def sniff_format(
    head: bytes, *, encoding: str, delimiter: str, path: str, id_column: str, text_column: str
) -> CsvFormat:
    """Decide codec, newline and delimiter from the input's first bytes (see module doc).

    ``encoding`` is ``auto`` or a Python codec name; ``delimiter`` is ``auto`` or one character.

    :raises InputError: a binary format (ZIP/xlsx, gzip without ``.gz``), a BOM that
        contradicts ``--encoding``, or bytes no detector can name.
    """
    _refuse_binary(head, path)
    codec, bom, notes = _sniff_codec(head, encoding, path)
    text = head[bom:].decode(codec, errors="replace")
    crlf = text.count("\r\n")
    lone_cr, lone_lf = text.count("\r") - crlf, text.count("\n") - crlf
    newline = "\r" if lone_cr > lone_lf else "\n"  # \n may still occur inside quoted fields
    if newline == "\r":
        notes.append("line ends: CR only")
    header = text.split(newline, 1)[0]
    if delimiter == "auto":
        delimiter = _sniff_delimiter(header, id_column, text_column)
        if delimiter != ",":
            notes.append(f"delimiter {delimiter!r} (found in the header)")
    return CsvFormat(codec, newline, delimiter, bom, "; ".join(notes))


def _refuse_binary(head: bytes, path: str) -> None:
    if head.startswith(b"\x1f\x8b"):
        raise InputError("the file is gzip-compressed but its name does not end in .gz; "
                         "rename it to ….csv.gz (it is then read as a stream)", path=path)
    if head.startswith(b"PK\x03\x04"):
        raise InputError("the file is a ZIP archive (an .xlsx workbook?), not CSV text; "
                         "export it as CSV (UTF-8) first", path=path)  # fmt: skip


def _sniff_codec(head: bytes, encoding: str, path: str) -> tuple[str, int, list[str]]:
    """Return (codec for each line, BOM bytes to skip, notes)."""
    wanted = encoding.lower().replace("_", "-")
    for bom, codec in _UTF16_BOMS.items():
        if head.startswith(bom):
            if wanted not in ("auto", "utf-16", codec):
                raise InputError(f"the file starts with a {codec.upper()} byte-order mark but "
                                 f"--encoding is {encoding}; pass --encoding auto",
                                 path=path, line=1)  # fmt: skip
            return codec, 2, [f"encoding {codec} (byte-order mark)"]
    if wanted == "utf-16":
        raise InputError("--encoding utf-16 needs a byte-order mark, and the file has none; "
                         "pass utf-16-le or utf-16-be", path=path, line=1)  # fmt: skip
    if wanted != "auto":
        name = codecs.lookup(encoding).name
        name = "utf-8" if name == "utf-8-sig" else name
        return name, 3 if name == "utf-8" and head.startswith(_UTF8_BOM) else 0, []
    if head.startswith(_UTF8_BOM):
        return "utf-8", 3, []
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return "utf-8", 0, []
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(head).best()
    if best is None or "\n".encode(best.encoding) != b"\n":
        raise InputError("the file is not UTF-8 and its encoding could not be detected; "
                         "pass --encoding with its real encoding (e.g. cp932, latin-1)",
                         path=path, line=1)  # fmt: skip
    codec = codecs.lookup(best.encoding).name
    if _single_byte(codec) or _katakana_garbage(head, codec):
        _refuse_guessed_code_page(head, codec, path)
    return codec, 0, [f"encoding {codec} (detected by charset-normalizer; pass --encoding to "
                      "override)"]


#: Single-byte code pages CSV exports really use, shown when refusing a guess: one byte
#: reads differently in each (https://www.unicode.org/Public/MAPPINGS/VENDORS/MICSFT/).
_CODE_PAGES = {"cp1252": "Windows Western", "iso8859-15": "ISO Western",
               "cp1250": "Windows Central European", "cp1251": "Windows Cyrillic",
               "koi8-r": "KOI8 Cyrillic", "cp1257": "Windows Baltic",
               "cp1254": "Windows Turkish", "cp850": "DOS Western"}  # fmt: skip


def _single_byte(codec: str) -> bool:
    """A one-byte-per-character code page (Python implements those as a charmap with a
    ``decoding_table``): cp125x, ISO 8859, KOI8, DOS, Mac. Multi-byte ones (cp932,
    GB18030, Big5, EUC) have a byte structure a detector can check; single-byte ones do
    not: charset-normalizer 3 read French cp1252 as cp1250 ("crème" became "crčme"),
    Lithuanian cp1257 as cp1251, Turkish cp1254 as KOI8-R, DOS cp850 as cp1252."""
    import importlib

    module = importlib.import_module(codecs.lookup(codec).incrementaldecoder.__module__)
    return hasattr(module, "decoding_table")


def _katakana_garbage(head: bytes, codec: str) -> bool:
    """A Shift-JIS/EUC-JP guess that decodes to mostly half-width katakana (U+FF61-FF9F):
    the single-byte letters of KOI8-R or cp1251 text read as Shift-JIS single bytes
    ("Привет" became "ﾐﾒﾉﾗﾅﾔ"), not Japanese, whose text is mostly kana and kanji."""
    if "jis" not in codec and codec != "cp932":
        return False
    wide = [c for c in head.decode(codec, errors="replace") if ord(c) > 0x7F]
    return bool(wide) and sum("\uff61" <= c <= "\uff9f" for c in wide) > len(wide) / 2


def _refuse_guessed_code_page(head: bytes, detected: str, path: str) -> None:
    """Refuse a code page detection cannot confirm: any choice could silently change texts,
    and so their vectors. The message shows how the first non-ASCII byte that code pages
    disagree on reads in each, so the user can pick ``--encoding``.

    :raises InputError: always; naming the byte's line.
    """
    guess = _CODE_PAGES.get(detected)
    pages = {detected: f"{guess}, the detector's guess" if guess else "the detector's guess",
             **{c: what for c, what in _CODE_PAGES.items() if c != detected}}
    offset = next((i for i, b in enumerate(head) if b >= 0x80 and len(
        {bytes([b]).decode(c, errors="replace") for c in _CODE_PAGES}) > 1), None)  # fmt: skip
    offset = offset if offset is not None else next(i for i, b in enumerate(head) if b >= 0x80)
    byte = head[offset:offset + 1]
    ways = ", ".join(f"{_reading(head, offset, c)} in {c} ({what})"
                     for c, what in pages.items())  # fmt: skip
    raise InputError(
        f"the file is not UTF-8, and its code page cannot be told from its bytes: byte "
        f"0x{byte[0]:02X} reads: {ways}. Pass --encoding with the code page it was exported "
        f"in (one of those, or another Python codec name), or export it as UTF-8",
        path=path, line=head.count(b"\n", 0, offset) + 1)


_WORD_ENDS = (b" ", b",", b";", b"\t", b"|", b'"', b"\n", b"\r")


def _reading(head: bytes, offset: int, codec: str) -> str:
    """The word around ``offset`` decoded as ``codec`` (a byte alone can be half a
    multi-byte character)."""
    start = max([head.rfind(sep, 0, offset) for sep in _WORD_ENDS] + [offset - 13]) + 1
    ends = [i for i in (head.find(sep, offset) for sep in _WORD_ENDS) if i != -1]
    end = min([*ends, offset + 12])
    return head[start:end].decode(codec, errors="replace")


def _sniff_delimiter(header: str, id_column: str, text_column: str) -> str:
    """The first of , ; TAB | that splits ``header`` into fields holding both columns; else
    the one giving most fields; else ``,`` (the header check then names what it found)."""
    best, most = ",", 1
    for candidate in _DELIMITERS:
        try:
            fields = next(csv.reader([header], delimiter=candidate), [])
        except csv.Error:
            continue
        if id_column in fields and text_column in fields:
            return candidate
        if len(fields) > most:
            best, most = candidate, len(fields)
    return best


@dataclass(slots=True)
class _Record:
    fields: list[str]
    line: int  # physical line where the record starts
    start: int  # byte offset of the record's first line
    stop: int  # byte offset just after its last line


def _records(lines: _Lines, path: str, delimiter: str = ",") -> Iterator[_Record]:
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
            yield _Record(fields, first_line, start, lines.offset)


@dataclass(frozen=True, slots=True)
class _Header:
    names: list[str]
    id_index: int
    text_index: int
    min_fields: int  # a row needs every field up to the last named column


def _parse_header(fields: list[str], *, id_column: str, text_column: str, path: str) -> _Header:
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
    if id_column == text_column:
        raise InputError("--id-column and --text-column must name different columns", path=path)
    for role, column in (("id", id_column), ("text", text_column)):
        if column not in seen:
            found = ", ".join(repr(n) for n in fields)
            raise InputError(
                f"no {role} column {column!r} in the header; columns found: {found}. "
                f"Pass --{role}-column with one of them",
                path=path,
                line=1,
                column=column,
            )
    last_named = max(i for i, name in enumerate(fields) if name)
    return _Header(fields, seen[id_column], seen[text_column], last_named + 1)


def _check_width(record: _Record, header: _Header, path: str) -> None:
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


def _row_id(record: _Record, header: _Header, path: str) -> str:
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


def _open_lines(
    fh: BinaryIO, source_path: str, fmt: CsvFormat, on_bytes: Callable[[bytes], None] | None
) -> _Lines:
    """Skip ``fh``'s BOM (hashing it) and wrap the rest in ``fmt``'s line reader."""
    bom = fh.read(fmt.bom)
    if on_bytes is not None and bom:
        on_bytes(bom)
    return _Lines(fh, codec=fmt.codec, path=source_path, line=0, offset=fmt.bom,
                  on_bytes=on_bytes, newline=fmt.newline)  # fmt: skip


def _sniff(fh: BinaryIO, path: str, encoding: str, delimiter: str, id_column: str,
           text_column: str) -> CsvFormat:  # fmt: skip
    head = fh.peek(_SNIFF_BYTES)[:_SNIFF_BYTES]  # type: ignore[attr-defined]
    return sniff_format(head, encoding=encoding, delimiter=delimiter, path=path,
                        id_column=id_column, text_column=text_column)  # fmt: skip


class _Planner:
    """Accumulates chunk specs while records stream past (one open chunk at a time)."""

    def __init__(self, *, chunk_size: int, model: str, dimensions: int | None) -> None:
        self.chunk_size = chunk_size
        self.model = model
        self.dimensions = dimensions
        self.chunks: list[ChunkSpec] = []
        self.start(byte_start=0, line_start=1)

    def start(self, *, byte_start: int, line_start: int) -> None:
        """Begin the first chunk at the first data record (drops the header's bytes)."""
        self._open(byte_start=byte_start, line_start=line_start, first_row=1)

    def _open(self, *, byte_start: int, line_start: int, first_row: int) -> None:
        self._key = ChunkKeyBuilder(self.model, self.dimensions)
        self._bytes = hashlib.sha256()
        self._byte_start, self._line_start, self._first_row = byte_start, line_start, first_row

    def feed_bytes(self, raw: bytes) -> None:
        self._bytes.update(raw)

    def add(self, row_id: str, text: str, *, stop: int, next_line: int) -> None:
        self._key.add(row_id, text_sha256(text))
        if self._key.rows == self.chunk_size:
            self.close(stop=stop)
            first_row = self._first_row + self.chunk_size
            self._open(byte_start=stop, line_start=next_line, first_row=first_row)

    def close(self, *, stop: int) -> None:
        if self._key.rows == 0:
            return
        self.chunks.append(
            ChunkSpec(
                index=len(self.chunks),
                key=self._key.hexdigest(),
                first_row=self._first_row,
                line_start=self._line_start,
                rows=self._key.rows,
                byte_start=self._byte_start,
                byte_stop=stop,
                bytes_sha256=self._bytes.hexdigest(),
            )
        )
        self._key = ChunkKeyBuilder(self.model, self.dimensions)


def plan_csv(
    path: str | os.PathLike[str],
    *,
    id_column: str,
    text_column: str,
    codec: str,
    chunk_size: int,
    model: str,
    dimensions: int | None,
    delimiter: str = ",",
) -> InputPlan:
    """Stream ``path`` once: validate it, hash it and cut it into chunks of ``chunk_size`` rows.

    ``path`` is a local path, a ``file://`` URI or ``s3://bucket/key`` (streamed, not
    downloaded first), ``.gz`` for gzip (decompressed as a stream; hashes, sizes and offsets
    are of the decompressed bytes).

    ``codec`` is ``auto`` or a Python codec name (``embedline.settings.codec_for``);
    ``delimiter`` is ``auto`` or one character (``sniff_format``). The plan's source records
    what was chosen (``encoding``, ``newline``, ``delimiter``, ``note``). The plan holds the
    file's SHA-256, size (bytes), record count and one ``ChunkSpec`` per chunk, each with its
    content key (DESIGN §2) and byte range.

    :raises InputError: (exit 2) unreadable file, UTF-16 file, undecodable bytes, missing or
        duplicated header column, malformed record, record with extra non-empty or missing
        fields, empty id, duplicate ids (the first few, with their lines), a header with no
        data rows under it. Every message names the file and the physical line where the
        record starts.
    """
    args = (os.fspath(path), id_column, text_column, codec, chunk_size, model, dimensions,
            delimiter)  # fmt: skip
    global _handed_over
    with _handed_over_lock:
        handed, _handed_over = _handed_over, None
    if handed is not None and handed[0] == (args, _local_file_stamp(args[0])):
        return handed[1]
    return _plan_csv(*args)


def hand_over_plan(plan: InputPlan, path: str | os.PathLike[str], *, id_column: str,
                   text_column: str, codec: str, chunk_size: int, model: str,
                   dimensions: int | None, delimiter: str = ",") -> None:  # fmt: skip
    """Let the next ``plan_csv`` of this process with the same arguments return ``plan``
    (once), if the local file's size, mtime and inode are still those seen now.

    ``embedline run`` plans before starting Prefect (a finished run answers at once) and its
    flow plans the same file about a second later: this skips that second pass (0.4 s of
    CPU for 27 MB). Chunk reads verify their bytes against the plan either way.
    """
    global _handed_over
    args = (os.fspath(path), id_column, text_column, codec, chunk_size, model, dimensions,
            delimiter)  # fmt: skip
    stamp = _local_file_stamp(args[0])
    with _handed_over_lock:
        _handed_over = None if stamp is None else ((args, stamp), plan)


#: The plan ``hand_over_plan`` left for the next ``plan_csv``: ((arguments, file stamp), plan).
_handed_over: tuple[tuple[Any, Any], InputPlan] | None = None
_handed_over_lock = threading.Lock()


def _local_file_stamp(path: str) -> tuple[int, int, int, int] | None:
    if "://" in path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def _plan_csv(
    path: str, id_column: str, text_column: str, codec: str, chunk_size: int, model: str,
    dimensions: int | None, delimiter: str,
) -> InputPlan:  # fmt: skip
    source_path = path
    file_hash = hashlib.sha256()
    planner = _Planner(chunk_size=chunk_size, model=model, dimensions=dimensions)
    id_digests = array("Q")

    def on_bytes(raw: bytes) -> None:
        file_hash.update(raw)
        planner.feed_bytes(raw)

    found = open_input(source_path)
    with found.open() as fh:
        source_path = found.uri
        fmt = _sniff(fh, source_path, codec, delimiter, id_column, text_column)
        lines = _open_lines(fh, source_path, fmt, on_bytes)
        records = _records(lines, source_path, fmt.delimiter)
        header_record = next(records, None)
        if header_record is None:
            raise InputError("the file is empty: expected a header line", path=source_path, line=1)
        header = _parse_header(
            header_record.fields, id_column=id_column, text_column=text_column, path=source_path
        )
        data_start = header_record.stop
        planner.start(byte_start=data_start, line_start=lines.line + 1)
        any_text = False
        for record in records:
            _check_width(record, header, source_path)
            row_id = _row_id(record, header, source_path)
            id_digests.append(_id_digest(row_id))
            text = record.fields[header.text_index]
            any_text = any_text or bool(text.strip())  # the rule of tasks.embed
            planner.add(row_id, text, stop=record.stop, next_line=lines.line + 1)
        planner.close(stop=lines.offset)  # trailing blank lines belong to the last chunk
        size = lines.offset
    _raise_on_duplicates(id_digests, found, fmt, header)
    if not id_digests:
        raise InputError(
            "the file has a header and no data rows: nothing to embed. An empty export "
            "committed as a run would read as 'every row removed' (and a sink load would "
            "delete every row); check the export, or skip this run", path=source_path, line=2)
    if not any_text:
        column = header.names[header.text_index]
        raise InputError(
            f"every text in column {column!r} is empty or whitespace ({len(id_digests):,} rows): "
            "nothing to embed. Committed, it would read as 'every row removed' (and a sink load "
            "would delete every row); check the export and --text-column", path=source_path,
            line=2, column=column)
    source = InputSource(
        path=found.uri,
        name=found.name,
        version=getattr(found, "etag", None),
        encoding=fmt.codec,
        newline=fmt.newline,
        delimiter=fmt.delimiter,
        note=fmt.note,
        id_column=id_column,
        text_column=text_column,
        id_index=header.id_index,
        text_index=header.text_index,
        n_fields=len(header.names),
        data_start=data_start,
    )
    return InputPlan(
        source=source,
        sha256=file_hash.hexdigest(),
        bytes=size,
        rows=len(id_digests),
        chunks=tuple(planner.chunks),
    )


def _id_digest(row_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(row_id.encode("utf-8"), digest_size=8).digest(), "little")


def _raise_on_duplicates(digests: array, found: Any, fmt: CsvFormat, header: _Header) -> None:
    """Raise InputError listing the first duplicated ids with their lines, if any.

    The pass kept only 64-bit digests; a second pass runs only when digests collide, and it
    confirms real duplicates (a digest collision of distinct ids is not reported).
    """
    if len(digests) < 2:
        return
    values, counts = np.unique(np.frombuffer(digests, dtype=np.uint64), return_counts=True)
    suspects = {int(v) for v in values[counts > 1]}
    if not suspects:
        return
    path = found.uri
    lines_by_id: dict[str, list[int]] = {}
    with found.open() as fh:
        records = _records(_open_lines(fh, path, fmt, None), path, fmt.delimiter)
        next(records)  # the header
        for record in records:
            row_id = record.fields[header.id_index]
            if _id_digest(row_id) in suspects:
                lines_by_id.setdefault(row_id, []).append(record.line)
    duplicates = [(i, ls) for i, ls in lines_by_id.items() if len(ls) > 1]
    if not duplicates:
        return
    shown = "; ".join(
        f"{row_id!r} at lines {', '.join(map(str, ls[:5]))}"
        for row_id, ls in duplicates[:_MAX_DUPLICATES_REPORTED]
    )
    more = len(duplicates) - _MAX_DUPLICATES_REPORTED
    column = header.names[header.id_index]
    raise InputError(
        f"{len(duplicates)} duplicated id(s) in column {column!r}: {shown}"
        + (f"; and {more} more" if more > 0 else "")
        + ". Ids must be unique: remove or rename the duplicates",
        path=path,
        line=duplicates[0][1][1],
        column=column,
    )


def check_header(
    path: str | os.PathLike[str], *, id_column: str, text_column: str, codec: str,
    delimiter: str = ",",
) -> CsvFormat:
    """Read only the header (and any BOM) of ``path``: a fast check before anything starts.
    Returns the format ``sniff_format`` chose (its ``note`` says what was detected).

    :raises InputError: unreadable or binary file, undecodable header, missing or duplicated
        id/text column, empty file.
    """
    found = open_input(os.fspath(path))
    with found.open() as fh:
        fmt = _sniff(fh, found.uri, codec, delimiter, id_column, text_column)
        records = _records(_open_lines(fh, found.uri, fmt, None), found.uri, fmt.delimiter)
        header = next(records, None)
    if header is None:
        raise InputError("the file is empty: expected a header line", path=found.uri, line=1)
    _parse_header(header.fields, id_column=id_column, text_column=text_column, path=found.uri)
    return fmt


def read_chunk(source: InputSource, spec: ChunkSpec) -> list[Row]:
    """Read the ``spec.rows`` records of one chunk by seeking to its byte range.

    Returns ``Row``s in input order. The bytes are checked against the plan's SHA-256 first,
    so a file edited after planning is refused rather than published under the old keys.

    :raises InputError: (exit 2) the input changed since planning, or cannot be read.
    """
    data = open_input(source.path, etag=source.version).read_range(spec.byte_start,
                                                                   spec.byte_stop)  # fmt: skip
    if hashlib.sha256(data).hexdigest() != spec.bytes_sha256:
        raise InputError(
            f"the input changed while the run read it (chunk {spec.index}, bytes "
            f"{spec.byte_start}-{spec.byte_stop}); rerun once the file is no longer being written",
            path=source.path,
            line=spec.line_start,
        )
    lines = _Lines(
        io.BytesIO(data),
        codec=source.encoding,
        path=source.path,
        line=spec.line_start - 1,
        offset=spec.byte_start,
        newline=source.newline,
    )
    rows = []
    records = _records(lines, source.path, source.delimiter)
    for number, record in enumerate(records, start=spec.first_row):
        text = record.fields[source.text_index]
        row_id = record.fields[source.id_index]
        rows.append(Row(number, record.line, row_id, text, text_sha256(text)))
    if len(rows) != spec.rows:
        raise InputError(
            f"chunk {spec.index} holds {len(rows)} records, the plan said {spec.rows}",
            path=source.path,
            line=spec.line_start,
        )
    return rows
