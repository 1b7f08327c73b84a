"""The real Debian CSVs the tests and the benchmark read, from the copies vendored in the repo.

``tests/data/debian-descriptions-{en,ja}.csv.gz`` are gzip copies of the project's real
inputs (Debian 12 package descriptions; see ``tests/data/README.md``), so a clone runs every
test without anything beside it. ``real_csv(name)`` decompresses one once per machine into
the temp directory and returns the plain file's path; the sha256 recorded below checks that
the bytes are the ones the tests were written against (quoted multi-line fields, the 81 KB
text, the one empty text).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["ENGLISH_NAME", "JAPANESE_NAME", "real_csv"]

VENDORED = Path(__file__).resolve().parents[1] / "data"
ENGLISH_NAME = "debian-descriptions-en.csv"
JAPANESE_NAME = "debian-descriptions-ja.csv"

#: sha256 of the plain files (27,494,890 and 3,705,539 bytes).
_SHA256 = {
    ENGLISH_NAME: "b878ab425f4bafb418bc0a75d9298232d6a902eb50b960e102ca040fd9ceb346",
    JAPANESE_NAME: "e4ad0dd6e07d3367a336b3bcffb5dea5cff474765a36dae25d37fd0d862405bb",
}


@functools.cache
def real_csv(name: str) -> Path:
    """Path of the plain CSV ``name`` (``ENGLISH_NAME`` or ``JAPANESE_NAME``), decompressed
    from ``tests/data/NAME.gz`` into ``$TMPDIR/embedline-real-data/`` on first use.

    Concurrent callers are safe: each writes its own temp file and renames it into place.

    :raises KeyError: ``name`` is not one of the vendored files.
    :raises ValueError: the decompressed bytes do not match the recorded sha256 (a damaged
        checkout: ``git checkout tests/data``).
    """
    expected = _SHA256[name]
    cache = Path(tempfile.gettempdir()) / "embedline-real-data"
    cache.mkdir(exist_ok=True)
    path = cache / name
    if path.exists() and _sha256(path) == expected:
        return path
    fd, partial = tempfile.mkstemp(dir=cache, prefix=f".{name}.")
    with os.fdopen(fd, "wb") as out, gzip.open(VENDORED / f"{name}.gz", "rb") as packed:
        shutil.copyfileobj(packed, out, 1 << 20)
    if _sha256(Path(partial)) != expected:
        os.unlink(partial)
        raise ValueError(
            f"{VENDORED / (name + '.gz')} does not hold the recorded bytes of "
            f"{name}; restore it with `git checkout tests/data`"
        )
    os.replace(partial, path)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
