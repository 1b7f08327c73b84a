"""LocalDirStore.put_file_if_absent: a create-only write streamed from a local file, with
put_if_absent's semantics (same bytes → not created, other bytes → ConflictError) and no
temp file left behind. The S3 twin: tests/integration/test_object_store_s3_put_file.py."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from adapters.object_store import LocalDirStore
from embedline.errors import ConflictError
from embedline.protocols import PutResult

KEY = "changes/run.parquet"


def _file(tmp_path: Path, name: str, body: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(body)
    return path


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp-" in p.name]


@pytest.fixture
def store(tmp_path: Path) -> LocalDirStore:
    return LocalDirStore(tmp_path / "out")


def test_put_file_creates_the_key_with_the_files_bytes_and_digest(
    store: LocalDirStore, tmp_path: Path
) -> None:
    body = os.urandom(3 << 20) + b"tail"  # several read blocks
    source = _file(tmp_path, "body", body)

    result = store.put_file_if_absent(KEY, source, content_type="application/x")

    assert result == PutResult(created=True, sha256=hashlib.sha256(body).hexdigest())
    assert store.get(KEY) == body
    assert source.read_bytes() == body  # copied, not moved
    assert _temp_files(store.root) == []


def test_second_create_same_bytes_succeeds_other_bytes_conflict(
    store: LocalDirStore, tmp_path: Path
) -> None:
    store.put_file_if_absent(KEY, _file(tmp_path, "a", b"first"), content_type="x")

    again = store.put_file_if_absent(KEY, _file(tmp_path, "b", b"first"), content_type="x")
    with pytest.raises(ConflictError, match="already holds other bytes"):
        store.put_file_if_absent(KEY, _file(tmp_path, "c", b"second"), content_type="x")

    assert again == PutResult(created=False, sha256=hashlib.sha256(b"first").hexdigest())
    assert store.get(KEY) == b"first"
    assert _temp_files(store.root) == []


def test_put_file_and_put_if_absent_agree_on_the_same_key(
    store: LocalDirStore, tmp_path: Path
) -> None:
    body = b"same body"
    store.put_if_absent(KEY, body, sha256=hashlib.sha256(body).hexdigest(), content_type="x")

    result = store.put_file_if_absent(KEY, _file(tmp_path, "a", body), content_type="x")

    assert result.created is False


def test_a_missing_source_file_creates_nothing(store: LocalDirStore, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        store.put_file_if_absent(KEY, tmp_path / "missing", content_type="x")

    assert store.head_sha256(KEY) is None
    assert _temp_files(tmp_path) == []


def test_sweep_removes_a_dead_writers_temp_file_under_changes(store: LocalDirStore) -> None:
    changes = store.root / "changes"
    changes.mkdir(parents=True)
    left = changes / f".run.parquet.tmp-{os.getpid()}-0123456789abcdef"
    left.write_bytes(b"partial")
    os.utime(left, (1, 1))

    assert store.sweep_temp_files(max_age_s=3600) == [str(left)]
    assert not left.exists()
