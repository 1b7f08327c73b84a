"""Planning's fast path: whole blocks of records parsed by Arrow's CSV parser, each block
checked to read exactly as ``csv.reader`` reads it, else handed back to ``csv.reader``.

Why: ``csv.reader`` yields a Python list of ``str`` per record and is fed one physical line
at a time, which makes it most of planning's CPU; and planning is most of what a night that
changed little costs (it must read the whole input once). Arrow's parser (``pyarrow.csv``)
reads the same bytes in C++ into string columns, from whose UTF-8 buffer the text hashes are
taken directly (``benchmarks/bench_planning.py`` measures both paths).

Where Arrow's reading and ``csv.reader``'s (``strict=True``, RFC 4180 quotes) could differ,
the block is not Arrow's to take, and ``csv.reader`` reads it and the rest of the input as
before (the same records, the same error naming the same line):

- quotes ``csv.reader`` refuses or reads literally: a quote run that opens a field not at a
  field's start, or closes a field followed by anything but the delimiter or a line end, or a
  quoted field still open at the block's end, a ``\\r`` outside quotes and not before a
  ``\\n`` (``_plain``); Arrow would read on;
- blank lines (Arrow skips them without a trace; planning numbers lines) and a lone ``\\r``
  (Arrow ends a record there): the records' physical lines, counted from the ``\\n`` in their
  fields, must add up to the block's ``\\n`` count;
- whatever Arrow refuses (a record with another field count, bytes that are not UTF-8);
- a record ``csv.reader`` would check further: an id that is empty, whitespace or holds
  ``\\x1f``, a first field that may be the header repeated;
- a block longer than ``csv.reader``'s field limit, or starting with a BOM (Arrow drops a
  BOM at the start of what it reads; ``csv.reader`` keeps it in the field).

Applies to UTF-8 inputs with ``\\n`` line ends (``csv_lines.block_decodable``) and RFC 4180
quotes, when the text is one column as read (no ``--text-template``, ``--normalize`` or
``--keep-columns``: those need every record's fields in Python anyway).

A block of records ends after the last ``\\n`` before which the count of quotes is even
(``record_end``): outside a quoted field, by the rules the check above holds each block to.
"""

from __future__ import annotations

import codecs
import collections
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import sha256
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from adapters.csv_lines import Blocks, Hashes

__all__ = ["RecordBatch", "RecordBlocks", "RecordShape", "applies", "record_end"]

_QUOTE, _NL, _CR = 0x22, 0x0A, 0x0D
_FIELD_LIMIT = 64 * 1024 * 1024  # csv_records._MAX_FIELD_CHARS: a longer block goes to csv
#: Bytes read without finding a record's end before ``csv.reader`` takes over (a stray quote
#: makes every later ``\n`` look quoted; this bounds what is held meanwhile).
_MAX_CARRY = 16 * 1024 * 1024
_LINES_TRIED = 32  # ``record_end``'s lines tried one by one before it looks at all at once
#: First bytes after which a text may be all whitespace by ``str.isspace``: ASCII whitespace,
#: the separators 0x1C-0x1F, and any non-ASCII lead byte (U+0085, U+00A0, U+3000, ...).
_SPACE_LEADS = frozenset({0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20})


def applies(codec: str, quoting: str, delimiter: str, *, plain_text: bool) -> bool:
    """Whether planning may read an input's data records with ``RecordBlocks``: a UTF-8
    input (``codec``; ``\\n`` line ends are the caller's ``Blocks``), RFC 4180 quotes
    (``quoting`` ``minimal``), a one-byte delimiter other than the quote, and the text one
    column as read (``plain_text``)."""
    utf8 = codecs.lookup(codec).name in {"utf-8", "utf-8-sig"}
    one_byte = len(delimiter.encode("utf-8")) == 1 and delimiter not in '"\r\n'
    return utf8 and quoting == "minimal" and one_byte and plain_text


@dataclass(frozen=True)
class RecordShape:
    """What planning takes of each data record: ``width`` fields split on ``delimiter``,
    the id and text at ``id_index``/``text_index`` (0-based), ``starts`` the first fields
    that may be the header again (such a block goes to ``csv.reader``), and
    ``truncate_bytes`` the UTF-8 bytes a text is cut to before it is hashed, sized and
    tested for emptiness (``keys.cut_text``; None: whole)."""

    width: int
    id_index: int
    text_index: int
    delimiter: str
    starts: frozenset[str]
    truncate_bytes: int | None = None


@dataclass(frozen=True)
class RecordBatch:
    """The records of one block, in order (``n`` rows): ``ids`` (``str``), the text's hex
    SHA-256 (``keys.text_sha256``) and UTF-8 size in bytes (``int32``), the positions of
    the empty or whitespace-only texts (``int64``, ascending), and the physical lines where
    each record starts and ends (``int64``, 1-based)."""

    ids: list[str]
    hashes: list[str]
    sizes: np.ndarray
    empties: np.ndarray
    lines: np.ndarray
    last_lines: np.ndarray


class RecordBlocks(Blocks):
    """``Blocks`` that also yields its data as ``RecordBatch``es (``batches``) until a block
    is not Arrow's to take (module docstring); iterated afterwards (``csv.reader``), it reads
    from that block on, as ``Blocks`` does.

    ``split_at(offset)`` first: the header's block is cut at the first data record, whose
    bytes the batches then read again (hashed into the input's SHA-256 once).
    """

    def __init__(
        self, fh: BinaryIO, *, codec: str, line: int, offset: int, hashes: Hashes | None = None
    ) -> None:
        super().__init__(fh, codec=codec, line=line, offset=offset, hashes=hashes)
        self._raw: Iterator[bytes] | None = None
        self._pending: collections.deque[bytes] = collections.deque()

    def _read(self) -> Iterator[bytes]:
        if self._raw is None:
            self._raw = Blocks._read(self)
        while self._pending:
            yield self._pending.popleft()
        # a for loop, not ``yield from``: closing an abandoned reader must not close _raw
        for block in self._raw:  # noqa: UP028
            yield block

    def split_at(self, offset: int) -> None:
        """Cut the block read last at ``offset`` (a record boundary in it): the rest is read
        again as the next block."""
        cut = offset - self._start
        assert 0 <= cut <= len(self._block)
        rest = self._block[cut:]
        self._block, self._ends = self._block[:cut], None
        self._block_lines = self._block.count(b"\n")
        self.offset -= len(rest)
        if rest:
            self._pending.appendleft(rest)
            self._file_hashed = len(rest)

    def batches(self, shape: RecordShape) -> Iterator[RecordBatch]:
        """The data records of ``shape`` a block at a time, until the input ends or a block
        is not Arrow's to take: that block is given back, and iterating this reader
        (``csv.reader``) starts there, at ``first_line``."""
        parse = _Parser(shape)
        carry = b""
        for data in self._read():
            buf = carry + data if carry else data
            cut = record_end(buf, after=len(carry))  # no record ends in the carry: scanned
            if not cut:
                carry = buf
                if len(carry) > _MAX_CARRY:
                    break
                continue
            block, carry = buf[:cut], buf[cut:]
            newlines = block.count(b"\n")
            batch = parse(block, self._next_line(), newlines)
            if batch is None:
                self._give_back(block + carry)
                return
            self._enter(block, newlines)
            yield batch
        self._give_back(carry)  # the last record has no newline, or a quote left open

    def _next_line(self) -> int:
        """The number of the first line after the block read last."""
        return self._lines_before + self._block_lines + 1

    def _give_back(self, data: bytes) -> None:
        if data:
            self._pending.appendleft(data)
        self.first_line = self._next_line()


def record_end(data: bytes, after: int = 0) -> int:
    """Offset just after the last ``\\n`` in ``data`` with an even count of quotes before
    it (outside a quoted field if ``data`` starts at a record and its quotes follow RFC
    4180), looking only at the ``\\n`` at ``after`` or later; 0 if there is none.

    The last few lines are tried one by one (a record's end is almost always among them);
    past them every ``\\n`` at once, so a quote left open over many lines costs linear time."""
    total = data.count(b'"')
    pos, behind = len(data), 0
    for _ in range(_LINES_TRIED):
        newline = data.rfind(b"\n", after, pos)
        if newline < 0:
            return 0
        behind += data.count(b'"', newline + 1, pos)
        if (total - behind) % 2 == 0:
            return newline + 1
        pos = newline
    arr = np.frombuffer(data, dtype=np.uint8)[after:pos]
    newlines = np.flatnonzero(arr == _NL)
    quotes_before = data.count(b'"', 0, after) + np.searchsorted(
        np.flatnonzero(arr == _QUOTE), newlines
    )
    even = newlines[quotes_before % 2 == 0]
    return after + int(even[-1]) + 1 if len(even) else 0


class _Parser:
    """One block of whole records into a ``RecordBatch``, or None where the block is not
    Arrow's to take (module docstring)."""

    def __init__(self, shape: RecordShape) -> None:
        width, delimiter = shape.width, shape.delimiter
        self.width, self.id_index, self.text_index = width, shape.id_index, shape.text_index
        self.truncate_bytes = shape.truncate_bytes
        self.delimiter = ord(delimiter)
        self.starts = pa.array(sorted(shape.starts), pa.string())
        self.names = [f"f{i}" for i in range(width)]
        names = self.names
        self.parse_options = pacsv.ParseOptions(
            delimiter=delimiter, newlines_in_values=True, ignore_empty_lines=False
        )
        self.convert_options = pacsv.ConvertOptions(
            column_types={name: pa.string() for name in names},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )

    def __call__(self, block: bytes, first_line: int, newlines: int) -> RecordBatch | None:
        """``block``'s records (it starts at physical line ``first_line`` and holds
        ``newlines`` ``\\n`` bytes), or None."""
        if len(block) > _FIELD_LIMIT or block.startswith(codecs.BOM_UTF8):
            return None  # Arrow drops a BOM at the start of what it reads; csv.reader keeps it
        if not _plain(block, self.delimiter):
            return None
        # one Arrow block for the whole block: a record longer than Arrow's default
        # block (1 MiB) would otherwise be refused as straddling two
        read_options = pacsv.ReadOptions(
            column_names=self.names, use_threads=False, block_size=len(block) + 1
        )
        try:
            table = pacsv.read_csv(
                pa.py_buffer(block),
                read_options=read_options,
                parse_options=self.parse_options,
                convert_options=self.convert_options,
            )
        except (pa.ArrowInvalid, pa.ArrowException):
            return None
        columns = [table.column(i).combine_chunks() for i in range(self.width)]
        spans = np.ones(table.num_rows, dtype=np.int64)
        for column in columns:
            spans += _newlines(column)
        lines = newlines + (0 if block.endswith(b"\n") else 1)
        if table.num_rows == 0 or int(spans.sum()) != lines:
            return None
        if pc.any(pc.is_in(columns[0], value_set=self.starts)).as_py():
            return None
        ids = columns[self.id_index]
        if (
            pc.min(pc.utf8_length(ids)).as_py() == 0
            or pc.any(pc.match_substring(ids, "\x1f")).as_py()
        ):
            return None
        id_list = ids.to_pylist()
        if any(map(str.isspace, id_list)):
            return None
        hashes, sizes, empties = _texts(columns[self.text_index], self.truncate_bytes)
        last_lines = first_line - 1 + np.cumsum(spans)
        return RecordBatch(id_list, hashes, sizes, empties, last_lines - spans + 1, last_lines)


def _texts(
    texts: pa.Array, truncate_bytes: int | None = None
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Hex SHA-256s, UTF-8 sizes (``int32``) and empty-or-whitespace positions of a string
    array, hashed from its buffer with no ``str`` per row; with ``truncate_bytes``, of each
    text cut as ``keys.cut_text`` cuts it."""
    n = len(texts)
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)[texts.offset : texts.offset + n + 1]
    data = texts.buffers()[2]
    view = memoryview(data) if data is not None else memoryview(b"")
    raw = np.frombuffer(view, dtype=np.uint8)
    starts = offsets[:-1]
    ends = offsets[1:] if truncate_bytes is None else _cut_ends(raw, offsets, truncate_bytes)
    firsts, lasts = starts.tolist(), ends.tolist()
    hashes = [sha256(view[a:b]).hexdigest() for a, b in zip(firsts, lasts, strict=True)]
    sizes = (ends - starts).astype(np.int32)
    filled = sizes > 0
    maybe = ~filled
    leads = raw[starts[filled]]
    maybe[filled] = (leads >= 0x80) | np.isin(leads, list(_SPACE_LEADS))
    candidates = np.flatnonzero(maybe)
    empty = [
        i
        for i in candidates.tolist()
        if sizes[i] == 0 or bytes(view[firsts[i] : lasts[i]]).decode("utf-8").isspace()
    ]
    return hashes, sizes, np.asarray(empty, dtype=np.int64)


def _cut_ends(raw: np.ndarray, offsets: np.ndarray, limit: int) -> np.ndarray:
    """Where each text of a UTF-8 buffer ends when cut to ``limit`` bytes less a character the
    cut would split (``keys.cut_text``): before the lead byte of a character that straddles
    the cut (continuation bytes are ``0b10xxxxxx``)."""
    ends: np.ndarray = np.minimum(offsets[1:], offsets[:-1] + limit)
    for i in np.flatnonzero(ends < offsets[1:]).tolist():
        end = int(ends[i])
        while raw[end] & 0xC0 == 0x80:
            end -= 1
        ends[i] = end
    return ends


def _newlines(strings: pa.Array) -> np.ndarray:
    """The count of ``\\n`` in each value of a string array (``int64``)."""
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)
    offsets = offsets[strings.offset : strings.offset + len(strings) + 1]
    data = strings.buffers()[2]
    if data is None:
        return np.zeros(len(strings), dtype=np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]
    found = np.flatnonzero(raw == _NL) + offsets[0]
    if not len(found):
        return np.zeros(len(strings), dtype=np.int64)
    rows = np.searchsorted(offsets, found, side="right") - 1
    return np.bincount(rows, minlength=len(strings)).astype(np.int64)


def _plain(block: bytes, delimiter: int) -> bool:
    """Whether every quote and carriage return in ``block`` (whole records from a record's
    start) is one ``csv.reader`` (``strict``, ``doublequote``) and Arrow read alike: each
    run of quotes outside a field opens one at the field's start (after the delimiter or a
    line end), each run inside a field either doubles quotes or closes the field right before
    the delimiter or a line end, no field is open at the end, and every ``\\r`` outside a
    quoted field comes right before a ``\\n`` (Arrow ends a record at a lone one, and skips
    the empty line a lone one at a line's start makes; ``csv.reader`` refuses it)."""
    arr = np.frombuffer(block, dtype=np.uint8)
    quotes = np.flatnonzero(arr == _QUOTE)
    return _quotes_plain(arr, quotes, delimiter) and _returns_plain(arr, quotes)


def _returns_plain(arr: np.ndarray, quotes: np.ndarray) -> bool:
    returns = np.flatnonzero(arr == _CR)
    if not len(returns):
        return True
    following = arr[np.minimum(returns + 1, len(arr) - 1)]
    lone = returns[(returns == len(arr) - 1) | (following != _NL)]
    return bool(np.all(np.searchsorted(quotes, lone) % 2 == 1))


def _quotes_plain(arr: np.ndarray, quotes: np.ndarray, delimiter: int) -> bool:
    if not len(quotes):
        return True
    first = np.ones(len(quotes), dtype=bool)
    first[1:] = np.diff(quotes) != 1
    run_starts = quotes[first]
    run_lengths = np.diff(np.append(np.flatnonzero(first), len(quotes)))
    inside = (np.cumsum(run_lengths) - run_lengths) % 2 == 1
    if (int(run_lengths.sum()) % 2) != 0:
        return False  # a field open at the block's end
    before = np.where(run_starts > 0, arr[np.maximum(run_starts - 1, 0)], _NL)
    ends = run_starts + run_lengths  # where each run's next byte is (the end: a line end)
    last = len(arr) - 1
    after = np.where(ends <= last, arr[np.minimum(ends, last)], _NL)
    after2 = np.where(ends + 1 <= last, arr[np.minimum(ends + 1, last)], _NL)
    opening = ~inside
    if not np.all((before[opening] == delimiter) | (before[opening] == _NL)):
        return False
    closes = (opening & (run_lengths % 2 == 0)) | (inside & (run_lengths % 2 == 1))
    ok_after = (after == delimiter) | (after == _NL) | ((after == _CR) & (after2 == _NL))
    return bool(np.all(ok_after[closes]))
