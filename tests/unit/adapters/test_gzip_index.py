"""GzipIndex: random decompressed ranges of real gzip files, checked against gzip.decompress."""

from __future__ import annotations

import gzip
import io
import random
import zlib
from pathlib import Path

import pytest

from adapters.gzip_index import GzipIndex
from adapters.input_source import open_input
from tests.support.real_data import JAPANESE_NAME, real_csv



def _payload(size: int, seed: int = 7) -> bytes:
    """Compressible but not trivial bytes: words drawn from a small vocabulary."""
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(2, 9))) for _ in range(500)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + b" \n"[rng.random() < 0.1: rng.random() < 0.1 + 1]
    return bytes(out[:size])


class _Counted(io.BytesIO):
    """A compressed stream that adds the bytes read from it to ``tally[0]``."""

    def __init__(self, data: bytes, tally: list[int]) -> None:
        super().__init__(data)
        self.tally = tally

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.tally[0] += len(data)
        return data


def _opener(blob: bytes, tally: list[int]):
    tally.append(0)

    def open_at(offset: int) -> io.BytesIO:
        return _Counted(blob[offset:], tally)

    return open_at


def test_random_ranges_match_a_full_decompression_and_resume_from_checkpoints() -> None:
    raw = _payload(3_000_000)
    blob = gzip.compress(raw, compresslevel=6)
    tally: list[int] = []
    index = GzipIndex(_opener(blob, tally), spacing_bytes=256 << 10)
    rng = random.Random(1)
    ranges = [(a, a + rng.randint(0, 90_000)) for a in
              (rng.randrange(len(raw)) for _ in range(60))]  # fmt: skip
    ranges += [(0, 10), (len(raw) - 5, len(raw) + 100), (len(raw) + 10, len(raw) + 20)]
    for start, stop in ranges:
        assert index.read_range(start, stop) == raw[start:stop]
    assert index.checkpoints >= len(raw) // (512 << 10)
    # from byte 0 every read would inflate half the file on average (63 reads: ~31 files)
    assert tally[0] < 10 * len(blob), (tally[0], len(blob))


def test_multi_member_files_are_read_across_member_boundaries() -> None:
    parts = [_payload(n, seed) for seed, n in enumerate((70_000, 1, 300_000, 0, 50_000))]
    blob = b"".join(gzip.compress(p) for p in parts)
    raw = b"".join(parts)
    index = GzipIndex(_opener(blob, []), spacing_bytes=20_000)
    for start in range(0, len(raw), 17_333):
        assert index.read_range(start, start + 40_000) == raw[start:start + 40_000]


def test_checkpoints_stay_bounded_by_thinning() -> None:
    raw = _payload(2_000_000)
    index = GzipIndex(_opener(gzip.compress(raw), []), spacing_bytes=10_000, max_points=16)
    assert index.read_range(len(raw) - 100, len(raw)) == raw[-100:]
    assert index.checkpoints <= 16
    assert index.read_range(1_000_000, 1_000_100) == raw[1_000_000:1_000_100]


def test_truncated_and_corrupt_files_raise() -> None:
    blob = gzip.compress(_payload(200_000))
    with pytest.raises(EOFError):
        GzipIndex(_opener(blob[: len(blob) // 2], [])).read_range(0, 10**9)
    corrupt = blob[:20] + bytes(64) + blob[84:]
    with pytest.raises(zlib.error):
        GzipIndex(_opener(corrupt, [])).read_range(0, 10**9)


def test_gzip_input_chunks_of_the_real_file_equal_the_plain_files_bytes(tmp_path: Path) -> None:
    raw = real_csv(JAPANESE_NAME).read_bytes()
    packed = tmp_path / "ja.csv.gz"
    packed.write_bytes(gzip.compress(raw))
    source = open_input(str(packed))
    step = max(1, len(raw) // 37)
    for start in list(range(0, len(raw), step))[::-1]:  # backwards: every read seeks back
        assert source.read_range(start, start + step) == raw[start:start + step]
