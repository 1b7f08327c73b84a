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
        out += rng.choice(words) + b" \n"[rng.random() < 0.1 : rng.random() < 0.1 + 1]
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
    ranges = [(a, a + rng.randint(0, 90_000)) for a in (rng.randrange(len(raw)) for _ in range(60))]
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
        assert index.read_range(start, start + 40_000) == raw[start : start + 40_000]


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
        assert source.read_range(start, start + step) == raw[start : start + step]


# Issue 22 item 8: the planning stream and the chunk reader read gzip with one code path, as
# Python's gzip module reads it (NUL padding after a member skipped), and trailing garbage
# is refused with its compressed offset.


def _padded(raw: bytes, members: int = 1, padding: bytes = b"\0" * 1024) -> bytes:
    step = -(-len(raw) // members)
    return b"".join(gzip.compress(raw[i : i + step]) + padding for i in range(0, len(raw), step))


@pytest.mark.parametrize("members", [1, 3])
def test_nul_padding_after_members_reads_as_python_gzip_reads_it(
    tmp_path: Path, members: int
) -> None:
    raw = _payload(700_000)
    blob = _padded(raw, members)
    assert gzip.decompress(blob) == raw  # the reference reader accepts the padding
    index = GzipIndex(_opener(blob, []), spacing_bytes=64 << 10)
    rng = random.Random(3)
    for start in [0, len(raw) - 10, *(rng.randrange(len(raw)) for _ in range(20))]:
        assert index.read_range(start, start + 50_000) == raw[start : start + 50_000]
    assert index.read_range(len(raw) - 5, len(raw) + 2000) == raw[-5:]
    path = tmp_path / "padded.csv.gz"
    path.write_bytes(blob)
    found = open_input(str(path))
    with found.open() as fh:
        assert fh.read() == raw  # the planning stream
    assert found.read_range(len(raw) - 100, len(raw) + 1024) == raw[-100:]


def test_trailing_garbage_is_refused_with_its_offset_by_both_readers(tmp_path: Path) -> None:
    from embedline.errors import InputError

    raw = _payload(200_000)
    member = gzip.compress(raw)
    path = tmp_path / "garbage.csv.gz"
    path.write_bytes(member + b"\0" * 16 + b"GARBAGE")
    offset = len(member) + 16
    found = open_input(str(path))
    with pytest.raises(InputError) as planning, found.open() as fh:
        fh.read()
    message = str(planning.value)
    assert f"byte offset {offset}" in message and str(path) in message
    assert "\n" not in message
    with pytest.raises(InputError, match=f"byte offset {offset}"):
        open_input(str(path)).read_range(len(raw) - 10, len(raw) + 10)
    assert GzipIndex(_opener(member, [])).read_range(0, 10) == raw[:10]  # the member alone


def test_a_cut_short_last_member_is_refused_naming_where_it_starts(tmp_path: Path) -> None:
    """A break test appended half a second member: the one line said "is it really gzip?"
    without the offset that keeps the complete members."""
    from embedline.errors import InputError

    first, second = gzip.compress(_payload(50_000)), gzip.compress(_payload(40_000))
    path = tmp_path / "half.csv.gz"
    path.write_bytes(first + second[: len(second) // 2])
    found = open_input(str(path))
    with pytest.raises(InputError) as planning, found.open() as fh:
        fh.read()
    message = str(planning.value)
    assert f"head -c {len(first)}" in message and "really gzip" not in message
    assert "\n" not in message
