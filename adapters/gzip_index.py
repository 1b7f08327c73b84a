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
are followed member by member, like ``gzip.GzipFile``. Memory: at most ``max_points``
checkpoints per file; past that every other one is dropped and the spacing doubles.
"""

from __future__ import annotations

import threading
import zlib
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["GzipIndex"]

_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer (RFC 1952), not raw deflate
_READ_BYTES = 1 << 16  # compressed bytes per read


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    out_offset: int  # decompressed bytes before this point
    in_offset: int  # compressed bytes consumed before this point
    inflater: object | None  # a zlib Decompress (copied before use); None: between members


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
        position, consumed = point.out_offset, point.in_offset
        inflater = point.inflater.copy() if point.inflater is not None else None  # type: ignore[attr-defined]
        with self._open_at(consumed) as stream:
            while position < stop:
                block = stream.read(_READ_BYTES)
                if not block:
                    if inflater is not None and not inflater.eof:
                        raise EOFError("the gzip file ends inside a member (truncated?)")
                    break
                consumed += len(block)
                data, inflater = _inflate(inflater, block)
                if position + len(data) > start:
                    out += data[max(0, start - position): stop - position]
                position += len(data)
                self._maybe_checkpoint(position, consumed, inflater)
        return bytes(out)

    def _maybe_checkpoint(self, position: int, consumed: int, inflater: object | None) -> None:
        if position - self._points[-1].out_offset < self._spacing:
            return  # also skips points behind the newest (a read that started earlier)
        between = inflater is None or inflater.eof  # type: ignore[attr-defined]
        self._points.append(_Checkpoint(position, consumed, None if between
                                        else inflater.copy()))  # type: ignore[attr-defined]
        if len(self._points) > self._max_points:
            self._points = self._points[::2]
            self._spacing *= 2


def _inflate(inflater: object | None, block: bytes) -> tuple[bytes, object | None]:
    """Inflate ``block``, starting new members as earlier ones end (RFC 1952 §2.2: a gzip
    file is a series of members). Returns the output and the inflater to continue with."""
    pieces = []
    while block:
        if inflater is None or inflater.eof:  # type: ignore[attr-defined]
            inflater = zlib.decompressobj(_GZIP_WBITS)
        pieces.append(inflater.decompress(block))  # type: ignore[attr-defined]
        block = inflater.unused_data if inflater.eof else b""  # type: ignore[attr-defined]
    return b"".join(pieces), inflater
