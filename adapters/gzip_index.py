"""Random access into a gzip stream by decompressed offset, without decompressing from 0.

gzip cannot seek: a chunk's bytes at decompressed offset *s* are normally reached only by
inflating everything before them, so a run of *n* chunks inflates the file about *n*/2
times. ``GzipIndex`` keeps zlib's inflate state (``zlib.decompressobj().copy()``, about
40 KB each: the 32 KiB window plus the stream state) at a checkpoint every ``spacing_bytes``
of decompressed output, the technique of zlib's own ``examples/zran.c``. A read resumes
from the nearest checkpoint at or before its start, reading the compressed stream from that
checkpoint's compressed offset, so each range costs at most ``spacing_bytes`` of extra
inflation once the index covers it. Checkpoints are made as a side effect of reads; there
is no separate indexing pass.

Multi-member files (concatenated gzip streams, as ``cat a.gz b.gz`` or pigz/bgzip write)
are followed member by member, and NUL bytes after a member are padding, skipped (files
written to block devices or tapes, some uploaders): both exactly as Python's ``gzip`` module
reads a file (``gzip._GzipReader._read_eof``: "Gzip files can be padded with zeroes").
Any other byte after a member must start a new one (``1f 8b``, RFC 1952 §2.3.1); if it does
not, ``NotGzipData`` names its compressed offset (where ``gzip`` would raise
``BadGzipFile``). ``GzipStream`` reads a whole file with the same ``_Members`` code, so the
planning pass and every chunk read agree on what the decompressed bytes are.

Memory: at most ``max_points`` checkpoints per file; past that every other one is dropped
and the spacing doubles.
"""

from __future__ import annotations

import io
import threading
import zlib
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from zlib import _Decompress

__all__ = ["GzipIndex", "GzipStream", "NotGzipData"]

_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer (RFC 1952), not raw deflate
_READ_BYTES = 1 << 16  # compressed bytes per read
_MAGIC = b"\x1f\x8b"  # RFC 1952 §2.3.1: ID1 ID2 start every member


class NotGzipData(ValueError):
    """Bytes after a gzip member that are neither NUL padding nor another member (trailing
    garbage), or a file that does not start with a member. ``offset``: their first byte's
    offset in the compressed file; ``decompressed``: decompressed bytes before it."""

    def __init__(self, offset: int, decompressed: int) -> None:
        super().__init__(f"byte {offset} of the compressed file does not start a gzip member")
        self.offset = offset
        self.decompressed = decompressed


class TruncatedMember(EOFError):
    """The compressed file ends inside a member (cut short: a file half-written or half
    uploaded). ``offset``: the compressed offset where that member starts (0: the only one)."""

    def __init__(self, offset: int) -> None:
        super().__init__("the gzip file ends inside a member (truncated?)")
        self.offset = offset


class _Members:
    """Inflates a gzip file fed block by block, member after member (RFC 1952 §2.2: a gzip
    file is a series of members), skipping NUL padding after a member as ``gzip`` does.

    ``inflater``: the current member's zlib Decompress (None before the first or between
    members); ``consumed``: compressed bytes fed so far; ``produced``: decompressed bytes.
    """

    def __init__(
        self, inflater: _Decompress | None = None, consumed: int = 0, produced: int = 0
    ) -> None:
        self.inflater = inflater
        self.consumed = consumed
        self.produced = produced
        self.member_start = 0  # compressed offset of the member being inflated

    @property
    def between(self) -> bool:
        """True before a member starts (no inflater state needed to resume here)."""
        return self.inflater is None or self.inflater.eof

    def feed(self, block: bytes) -> bytes:
        """Inflate the next compressed ``block``; returns the decompressed bytes.

        :raises NotGzipData: a byte after a member (or at 0) starts no member.
        :raises zlib.error: corrupt deflate data or a bad CRC/length trailer.
        """
        pieces: list[bytes] = []
        pos, base = 0, self.consumed
        while pos < len(block):
            if self.between:
                if base + pos > 0:  # padding is allowed after a member, not before the first
                    rest = block[pos:]
                    pos += len(rest) - len(rest.lstrip(b"\0"))
                    if pos == len(block):
                        break
                if not _MAGIC.startswith(block[pos : pos + 2]):
                    raise NotGzipData(base + pos, self.produced + sum(map(len, pieces)))
                self.inflater = zlib.decompressobj(_GZIP_WBITS)
                self.member_start = base + pos
            inflater = self.inflater
            assert inflater is not None  # not between members: one is open
            data = inflater.decompress(block[pos:])
            pieces.append(data)
            ended = inflater.eof
            unused = inflater.unused_data if ended else b""
            pos = len(block) - len(unused)
        self.consumed = base + len(block)
        out = b"".join(pieces)
        self.produced += len(out)
        return out

    def finish(self) -> None:
        """The compressed file ended. :raises TruncatedMember: inside a member."""
        if not self.between:
            raise TruncatedMember(self.member_start)


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    out_offset: int  # decompressed bytes before this point
    in_offset: int  # compressed bytes consumed before this point
    inflater: _Decompress | None  # copied before use; None: between members


class GzipIndex:
    """Reads decompressed byte ranges of one gzip file; thread-safe (reads are serialized).

    ``open_at(offset)`` returns a binary stream of the *compressed* file from byte
    ``offset`` (a local file seeked there, or an S3 ranged GET): the index never holds the
    file. ``spacing_bytes``: decompressed bytes between checkpoints; ``max_points``: the most
    checkpoints kept.
    """

    def __init__(
        self,
        open_at: Callable[[int], BinaryIO],
        *,
        spacing_bytes: int = 4 << 20,
        max_points: int = 512,
    ) -> None:
        self._open_at = open_at
        self._spacing = spacing_bytes
        self._max_points = max_points
        self._points = [_Checkpoint(0, 0, None)]
        self._lock = threading.Lock()

    @property
    def checkpoints(self) -> int:
        """How many checkpoints the index holds (1 before any read: the start)."""
        return len(self._points)

    def read_range(self, start: int, stop: int) -> bytes:
        """Return decompressed bytes ``[start, stop)``; fewer if the file ends first.

        :raises zlib.error: the compressed data is corrupt.
        :raises EOFError: the file ends inside a gzip member (truncated).
        :raises OSError: ``open_at`` failed.
        """
        if stop <= start:
            return b""
        with self._lock:
            point = self._points[bisect_right([p.out_offset for p in self._points], start) - 1]
            return self._inflate_from(point, start, stop)

    def _inflate_from(self, point: _Checkpoint, start: int, stop: int) -> bytes:
        out = bytearray()
        inflater = point.inflater.copy() if point.inflater is not None else None
        members = _Members(inflater, point.in_offset, point.out_offset)
        with self._open_at(point.in_offset) as stream:
            while members.produced < stop:
                block = stream.read(_READ_BYTES)
                if not block:
                    members.finish()
                    break
                position = members.produced
                data = members.feed(block)
                if position + len(data) > start:
                    out += data[max(0, start - position) : stop - position]
                self._maybe_checkpoint(members)
        return bytes(out)

    def _maybe_checkpoint(self, members: _Members) -> None:
        if members.produced - self._points[-1].out_offset < self._spacing:
            return  # also skips points behind the newest (a read that started earlier)
        current: Any = members.inflater
        inflater = None if members.between else current.copy()
        self._points.append(_Checkpoint(members.produced, members.consumed, inflater))
        if len(self._points) > self._max_points:
            self._points = self._points[::2]
            self._spacing *= 2


class GzipStream(io.RawIOBase):
    """The decompressed bytes of a whole gzip file, read from ``compressed`` (a binary stream
    from its first byte) with the same ``_Members`` code as ``GzipIndex`` reads ranges.

    ``read``/``readinto`` raise ``NotGzipData``, ``zlib.error`` (corrupt) or ``EOFError``
    (truncated); closing closes ``compressed``.
    """

    def __init__(self, compressed: BinaryIO) -> None:
        super().__init__()
        self._fh = compressed
        self._members = _Members()
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            block = self._fh.read(_READ_BYTES)
            if not block:
                self._members.finish()
                return 0
            self._pending = memoryview(self._members.feed(block))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
        super().close()
