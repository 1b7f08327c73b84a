"""Physical lines of a CSV input for ``csv.reader``, with their numbers, byte offsets and hashes.

Two readers hand ``csv.reader`` the same lines (a line ends after its newline; line 1 is the
first line after any BOM), and answer the same questions: the byte offset just after a line
(a record boundary, where a chunk starts or stops), the SHA-256 of the whole input and of
each chunk's bytes (``begin`` at the first data record, ``cut`` at each chunk's end):

- ``Blocks``, the fast path: reads ``BLOCK_BYTES`` at a time, cut after the block's last
  ``\\n``; hashes each block whole and slices it at chunk boundaries; decodes it in one call
  and lets ``io.StringIO(newline="\\n")`` split it into lines in C (it splits on ``\\n``
  only and keeps it). Byte offsets come from the block's newline positions, computed only
  for a block in which one is asked for. ``csv.reader`` reads lines only as a record needs
  them, so the line a caller asks about is always in the block read last.
- ``Lines``, the reference: one physical line at a time (``readline`` in C), each hashed and
  decoded strictly on its own, so an undecodable byte is reported with its line and its
  position in that line. It is the path for what ``Blocks`` does not cover: CR-only line
  ends, UTF-16 (a two-byte newline), and codecs not known to decode alike by blocks.

``block_decodable(codec, newline)``: decoding a block at once equals decoding its lines one
by one and joining them when the newline is ``\\n`` and the codec is stateless with 0x0A never
inside a multi-byte character: UTF-8 (RFC 3629 §3: bytes below 0x80 are only ever ASCII),
ASCII, Latin-1, single-byte code pages whose byte 0x0A alone reads ``\\n``, and the CJK
multi-byte codecs in ``_BLOCK_CODECS`` (their trail bytes are 0x30 or above; checked for
every two-byte sequence by the tests). Stateful codecs (ISO-2022, HZ, UTF-7) are not among
them. When ``Blocks`` meets bytes it cannot decode it raises ``NeedsLineReader``: the
caller reads the input again with ``Lines``, which raises the error a line-by-line reader
meets first (an earlier bad record, or the byte with its line and column), word for word.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import itertools
from collections.abc import Iterator
from typing import BinaryIO, Protocol

import numpy as np

from adapters.csv_format import single_byte_codec
from embedline.errors import InputError

__all__ = [
    "BLOCK_BYTES",
    "Blocks",
    "Hashes",
    "LineSource",
    "Lines",
    "NeedsLineReader",
    "block_decodable",
]

#: Bytes ``Blocks`` reads at a time; a block then ends after its last newline (a longer line
#: makes a longer block). 1 MiB measured fastest (decoding 4 MiB at once was 3x slower per
#: byte: the text no longer fits the CPU caches). Tests set it small so records cross blocks.
BLOCK_BYTES = 1 << 20

_LINE_BLOCK = 1 << 20  # bytes ``Lines`` reads at a time when the newline is not b"\n"

#: Stateless multi-byte codecs (``codecs.lookup(name).name``) in which 0x0A is never part of
#: a multi-byte character: Japanese, Chinese and Korean (CPython Modules/cjkcodecs).
_BLOCK_CODECS = frozenset(
    {
        "utf-8",
        "ascii",
        "iso8859-1",
        "cp932",
        "shift_jis",
        "shift_jis_2004",
        "shift_jisx0213",
        "euc_jp",
        "euc_jis_2004",
        "euc_jisx0213",
        "gb2312",
        "gbk",
        "gb18030",
        "big5",
        "big5hkscs",
        "cp949",
        "euc_kr",
        "cp950",
        "johab",
    }
)


class NeedsLineReader(Exception):
    """Raised by ``Blocks`` for bytes it cannot decode: read the input again with ``Lines``,
    which names the line and byte (never shown to a user)."""


def block_decodable(codec: str, newline: str) -> bool:
    """Whether ``Blocks`` reads a ``codec`` input with line ends ``newline`` exactly as
    ``Lines`` does (module docstring)."""
    if newline != "\n":
        return False
    name = codecs.lookup(codec).name
    if name in _BLOCK_CODECS:
        return True
    if not single_byte_codec(codec):
        return False
    every_byte = bytes(range(256)).decode(codec, errors="replace")
    return len(every_byte) == 256 and every_byte.find("\n") == every_byte.rfind("\n") == 0x0A


class Hashes:
    """SHA-256 of the whole input (``file``) and of the open chunk's bytes (``chunk``)."""

    __slots__ = ("chunk", "file")

    def __init__(self) -> None:
        self.file = hashlib.sha256()
        self.chunk = hashlib.sha256()

    def take(self) -> str:
        """The open chunk's hex digest; the next chunk starts empty."""
        digest = self.chunk.hexdigest()
        self.chunk = hashlib.sha256()
        return digest


class LineSource(Protocol):
    """What ``csv_records.read_records`` and planning need of ``Lines`` and ``Blocks``."""

    first_line: int  # number of the first line read (1-based)
    offset: int  # bytes of the input read so far (after the last one: its size)
    hashes: Hashes | None  # None: nothing is hashed (chunk reads, the duplicate pass)

    def __iter__(self) -> Iterator[str]: ...

    def offset_after(self, line: int) -> int:
        """Byte offset just after physical line ``line``: the last line read."""
        ...

    def begin(self, offset: int) -> None:
        """Start the chunk hash at byte ``offset`` (just after the last line read)."""
        ...

    def cut(self, stop: int) -> str:
        """Hex SHA-256 of the bytes from the last ``begin``/``cut`` to ``stop``."""
        ...


class _Reader:
    """What both readers hold: the byte stream, its codec, where it starts in the input (it
    follows ``line`` lines and ``offset`` bytes) and the hashes to feed."""

    def __init__(
        self, fh: BinaryIO, *, codec: str, line: int, offset: int, hashes: Hashes | None
    ) -> None:
        self._fh = fh
        self._codec = codec
        self.first_line = line + 1
        self.offset = offset
        self.hashes = hashes


class Lines(_Reader):
    """Iterator of decoded physical lines, one at a time (the reference reader).

    ``line`` is the number of the last line yielded; ``offset`` the byte offset just after
    it. With ``hashes``, every raw line is hashed before decoding.
    """

    def __init__(
        self,
        fh: BinaryIO,
        *,
        codec: str,
        path: str,
        line: int,
        offset: int,
        hashes: Hashes | None = None,
        newline: str = "\n",
    ) -> None:
        super().__init__(fh, codec=codec, line=line, offset=offset, hashes=hashes)
        self._path = path
        self.line = line
        separator = newline.encode(codec)
        if separator == b"\n":
            self._raw: Iterator[bytes] = iter(fh.readline, b"")  # in C
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
        if self.hashes is not None:
            self.hashes.file.update(raw)
            self.hashes.chunk.update(raw)
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

    def offset_after(self, line: int) -> int:
        """Byte offset just after line ``line``, which must be the last line read."""
        assert line == self.line, (line, self.line)
        return self.offset

    def begin(self, offset: int) -> None:
        """Start the chunk hash here (``offset`` is where the last line read ends)."""
        assert offset == self.offset and self.hashes is not None, (offset, self.offset)
        self.hashes.chunk = hashlib.sha256()

    def cut(self, stop: int) -> str:
        """The chunk's hex SHA-256, ending where the last line read ends (``stop``)."""
        assert stop == self.offset and self.hashes is not None, (stop, self.offset)
        return self.hashes.take()


def _unit(codec: str) -> int:
    """Bytes per code unit: where a line break may start (2 for UTF-16)."""
    return len("\n".encode(codec))


def _split_lines(fh: BinaryIO, separator: bytes, *, unit: int) -> Iterator[bytes]:
    """Yield ``fh``'s lines, each with its ``separator``, which counts only at an offset that
    is a multiple of ``unit`` (so UTF-16's ``0A 00`` never matches across two characters)."""
    buf = b""
    while True:
        block = fh.read(_LINE_BLOCK)
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


class Blocks(_Reader):
    """Decoded lines of a ``\\n``-separated input, read, hashed and decoded a block at a time
    (the fast path; see the module docstring for when it applies).

    Iterate it once: the lines, as ``io.StringIO`` objects chained (``csv.reader`` takes
    each line in C). ``offset`` counts the bytes read so far, blocks whole.

    :raises NeedsLineReader: (while iterating) a block does not decode strictly.
    """

    def __init__(
        self, fh: BinaryIO, *, codec: str, line: int, offset: int, hashes: Hashes | None = None
    ) -> None:
        super().__init__(fh, codec=codec, line=line, offset=offset, hashes=hashes)
        self._block_bytes = BLOCK_BYTES
        self._block = b""  # the block read last
        self._start = offset  # its byte offset in the input
        self._lines_before = line  # physical lines before it
        self._block_lines = 0  # the count of ``\n`` in it (counted once: a pass over it)
        self._hashed = 0  # its bytes already in the chunk hash (or before ``begin``)
        self._ends: np.ndarray | None = None  # offsets in it just after each of its lines
        self._file_hashed = 0  # bytes of the blocks entered next already in the file hash

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(self._texts())

    def _texts(self) -> Iterator[io.StringIO]:
        for block in self._read():
            self._enter(block)
            try:
                text = block.decode(self._codec)
            except UnicodeDecodeError:
                raise NeedsLineReader from None
            yield io.StringIO(text, newline="\n")

    def _read(self) -> Iterator[bytes]:
        """The input's bytes in blocks that each end after a newline (the last one: at the
        end of the input, newline or not)."""
        parts: list[bytes] = []  # a line longer than a block, so far
        while data := self._fh.read(self._block_bytes):
            cut = data.rfind(b"\n") + 1
            if not cut:
                parts.append(data)
                continue
            if parts:
                yield b"".join((*parts, data[:cut]))
                parts = []
            else:
                yield data[:cut] if cut < len(data) else data
            if cut < len(data):
                parts.append(data[cut:])
        if parts:
            yield b"".join(parts)

    def _enter(self, block: bytes, newlines: int | None = None) -> None:
        """Make ``block`` the current block: the rest of the previous one goes to the chunk
        hash, this one to the file hash (but for bytes already in it: ``_file_hashed``).
        ``newlines``: the count of ``\n`` in ``block`` when the caller has it."""
        skip = min(self._file_hashed, len(block))
        self._file_hashed -= skip
        if self.hashes is not None:
            self.hashes.chunk.update(memoryview(self._block)[self._hashed :])
            self.hashes.file.update(memoryview(block)[skip:])
        self._lines_before += self._block_lines
        self._start += len(self._block)
        self._block, self._hashed, self._ends = block, 0, None
        self._block_lines = block.count(b"\n") if newlines is None else newlines
        self.offset += len(block)

    def offset_after(self, line: int) -> int:
        """Byte offset just after line ``line``, which must be in the block read last."""
        if self._ends is None:
            newlines = np.flatnonzero(np.frombuffer(self._block, np.uint8) == 0x0A)
            self._ends = newlines + 1
            if not self._block.endswith(b"\n"):  # the input's last line, without a newline
                self._ends = np.append(self._ends, len(self._block))
        index = line - self._lines_before - 1
        assert 0 <= index < len(self._ends), (line, self._lines_before)
        return self._start + int(self._ends[index])

    def begin(self, offset: int) -> None:
        """Start the chunk hash at ``offset``, in the block read last."""
        assert self.hashes is not None and self._start <= offset <= self.offset
        self.hashes.chunk = hashlib.sha256()
        self._hashed = offset - self._start

    def cut(self, stop: int) -> str:
        """Hex SHA-256 of the bytes from the last ``begin``/``cut`` to ``stop`` (in the block
        read last)."""
        assert self.hashes is not None and self._start + self._hashed <= stop <= self.offset
        end = stop - self._start
        self.hashes.chunk.update(memoryview(self._block)[self._hashed : end])
        self._hashed = end
        return self.hashes.take()
