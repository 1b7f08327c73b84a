"""LocalDirStore: create-only writes with os.link, no temp file left behind; open_store URIs.

No sockets here: the S3 store is covered by tests/integration/test_object_store_s3.py.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from adapters import object_store
from adapters.object_store import (
    LocalDirStore,
    S3Store,
    check_conditional_writes,
    open_store,
)
from embedline.errors import ConflictError, FatalError, InputError
from embedline.protocols import PutResult

KEY = "chunks/abc.parquet"


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def put(store: LocalDirStore, key: str, body: bytes) -> PutResult:
    return store.put_if_absent(key, body, sha256=sha(body), content_type="application/x")


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp-" in p.name]


@pytest.fixture
def store(tmp_path: Path) -> LocalDirStore:
    return LocalDirStore(tmp_path / "out")


def test_adapters_package_is_the_repo_one() -> None:
    repo = Path(__file__).resolve().parents[4]
    assert Path(object_store.__file__).resolve().is_relative_to(repo)


def test_put_creates_the_file_with_the_bytes(store: LocalDirStore) -> None:
    result = put(store, KEY, b"payload")

    assert result == PutResult(created=True, sha256=sha(b"payload"))
    assert (store.root / "chunks" / "abc.parquet").read_bytes() == b"payload"
    assert store.get(KEY) == b"payload"
    assert store.head_sha256(KEY) == sha(b"payload")
    assert temp_files(store.root) == []


def test_put_same_bytes_again_reports_not_created(store: LocalDirStore) -> None:
    put(store, KEY, b"payload")
    before = os.stat(store.uri_for(KEY))

    result = put(store, KEY, b"payload")

    assert result.created is False
    assert os.stat(store.uri_for(KEY)).st_ino == before.st_ino  # same file, not replaced
    assert temp_files(store.root) == []


def test_put_other_bytes_raises_conflict_and_keeps_original(store: LocalDirStore) -> None:
    put(store, KEY, b"original")

    with pytest.raises(ConflictError) as info:
        put(store, KEY, b"different")

    assert KEY in str(info.value)
    assert store.get(KEY) == b"original"
    assert temp_files(store.root) == []


def test_put_with_wrong_sha256_is_a_programming_error(store: LocalDirStore) -> None:
    with pytest.raises(ValueError, match="does not match"):
        store.put_if_absent(KEY, b"body", sha256=sha(b"other"), content_type="x")

    assert store.head_sha256(KEY) is None
    assert temp_files(store.root) == []


def test_no_temp_file_left_when_target_is_a_directory(store: LocalDirStore) -> None:
    # A real failure after the temp file is written: link(2) finds a directory there.
    (store.root / "chunks" / "abc.parquet").mkdir(parents=True)

    with pytest.raises(ConflictError, match="not a regular file"):
        put(store, KEY, b"payload")

    assert temp_files(store.root) == []


def test_no_temp_file_left_when_link_is_unsupported(
    store: LocalDirStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A filesystem without hard links (some FUSE/SMB mounts) fails link(2) with EPERM.
    def refuse(src: object, dst: object) -> None:
        assert Path(str(src)).exists()  # the temp file was written before the link
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)

    with pytest.raises(FatalError, match="cannot write") as info:
        put(store, KEY, b"payload")

    assert isinstance(info.value.__cause__, PermissionError)
    assert store.head_sha256(KEY) is None
    assert temp_files(store.root) == []


def test_no_temp_file_left_when_fsync_fails(
    store: LocalDirStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:  # fails for the temp file, not for directories
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)

    with pytest.raises(OSError) as info:
        put(store, KEY, b"payload")

    assert info.value.errno == errno.EIO  # unknown errors are re-raised unchanged
    monkeypatch.undo()
    assert store.head_sha256(KEY) is None
    assert temp_files(store.root) == []


def test_sixteen_threads_racing_one_key_create_it_once(store: LocalDirStore) -> None:
    body = b"x" * 100_000
    barrier = threading.Barrier(16)
    results: list[PutResult] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        result = put(store, KEY, body)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(results) == 16
    assert sum(r.created for r in results) == 1
    assert store.get(KEY) == body
    assert temp_files(store.root) == []


def test_racing_different_bodies_one_wins_others_conflict(store: LocalDirStore) -> None:
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        body = f"body {i}".encode()
        barrier.wait()
        try:
            put(store, KEY, body)
            outcome = "created"
        except ConflictError:
            outcome = "conflict"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(outcomes) == ["conflict"] * 7 + ["created"]
    assert store.get(KEY).startswith(b"body ")


def test_head_and_get_of_missing_key(store: LocalDirStore) -> None:
    assert store.head_sha256("manifests/none.json") is None
    with pytest.raises(FileNotFoundError):
        store.get("manifests/none.json")


def test_reading_a_key_where_a_directory_or_a_file_stands_in_the_way_is_a_conflict(
    store: LocalDirStore, tmp_path: Path
) -> None:
    """A directory at a chunk's key (or a file where ``chunks/`` should be) is refused with
    the path and what to do: it was an IsADirectoryError traceback from the skip check."""
    (tmp_path / "out" / "chunks" / "a.parquet").mkdir(parents=True)
    (tmp_path / "out" / "manifests").write_text("a file where a directory should be")
    # every read of the key: the existence check, and the publish's read of what stands
    # there (it was an IsADirectoryError traceback and a "rerun" hint, exit 1)
    for read in (store.head_sha256, store.get, lambda key: store.open_read(key).close()):
        with pytest.raises(ConflictError, match=r"chunks/a\.parquet .*fresh --output"):
            read("chunks/a.parquet")
        with pytest.raises(ConflictError, match=r"manifests/m\.json"):
            read("manifests/m.json")


@pytest.mark.parametrize(
    "key", ["", "/etc/passwd", "../escape", "chunks/../../x", "chunks//x", "./x", "a\\b"]
)
def test_bad_keys_are_rejected(store: LocalDirStore, key: str) -> None:
    with pytest.raises(ValueError):
        put(store, key, b"x")
    assert not (store.root.parent / "escape").exists()


def test_uri_and_uri_for_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = LocalDirStore("rel/out")

    assert store.uri == str(tmp_path / "rel" / "out")
    assert store.uri_for("manifests/r.json") == str(tmp_path / "rel/out/manifests/r.json")


def test_check_conditional_writes_is_true_and_cleans_up(store: LocalDirStore) -> None:
    assert check_conditional_writes(store) is True
    assert list((store.root / "_embedline").rglob("*")) == [
        store.root / "_embedline" / "conditional-write-check"
    ]


def test_discard_scratch_refuses_real_keys(store: LocalDirStore) -> None:
    put(store, KEY, b"payload")
    with pytest.raises(ValueError, match="refusing"):
        store.discard_scratch(KEY)
    assert store.get(KEY) == b"payload"


def test_sweep_removes_old_and_dead_writers_temp_files(store: LocalDirStore) -> None:
    put(store, KEY, b"payload")
    chunks = store.root / "chunks"
    live = os.getppid()  # a live process that is not this one
    dead_child = subprocess.Popen(["true"])
    dead_child.wait()  # reaped: its pid names no process now
    old = chunks / f".abc.parquet.tmp-{live}-0123456789abcdef"
    young = chunks / f".def.parquet.tmp-{live}-fedcba9876543210"
    killed = chunks / f".ghi.parquet.tmp-{dead_child.pid}-00112233445566ff"
    lookalike = chunks / ".abc.parquet.tmp-notours"
    for path in (old, young, killed, lookalike):
        path.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))

    removed = store.sweep_temp_files(max_age_s=3600)

    assert sorted(removed) == sorted([str(old), str(killed)])
    assert not old.exists() and not killed.exists()
    assert young.exists() and lookalike.exists()
    assert store.get(KEY) == b"payload"


# ------------------------------------------------------------------ open_store


def test_open_store_plain_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("./embedline-output")
    assert isinstance(store, LocalDirStore)
    assert store.uri == str(tmp_path / "embedline-output")


def test_open_store_file_uri(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/out%20dir")
    assert isinstance(store, LocalDirStore)
    assert store.uri == str(tmp_path / "out dir")


@pytest.mark.parametrize(
    ("uri", "uri_of_store", "key_uri"),
    [
        ("s3://bucket-a", "s3://bucket-a", "s3://bucket-a/chunks/k.parquet"),
        ("s3://bucket-a/", "s3://bucket-a", "s3://bucket-a/chunks/k.parquet"),
        (
            "s3://bucket-a/runs/2026/",
            "s3://bucket-a/runs/2026",
            "s3://bucket-a/runs/2026/chunks/k.parquet",
        ),
    ],
)
def test_open_store_s3(uri: str, uri_of_store: str, key_uri: str) -> None:
    store = open_store(uri)  # opens no connection: the client is built on first use
    assert isinstance(store, S3Store)
    assert store.uri == uri_of_store
    assert store.uri_for("chunks/k.parquet") == key_uri


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "empty"),
        ("s3://", "no bucket"),
        ("s3:///prefix", "no bucket"),
        ("gs://bucket/x", "unsupported scheme 'gs'"),
        ("https://example.com/x", "unsupported scheme 'https'"),
        ("file://relative/path", "absolute path"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket?versionId=1", "not a valid bucket name"),  # a "?" in a key is literal
    ],
)
def test_open_store_rejects_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        open_store(uri)
    assert message in str(info.value)
    assert "s3://bucket or s3://bucket/prefix" in str(info.value)  # lists accepted forms
    assert info.value.exit_code == 2


def test_open_store_never_echoes_uri_credentials() -> None:
    with pytest.raises(InputError) as info:
        open_store("s3://AKIDEXAMPLE:s3cr3t@bucket/x")
    assert "s3cr3t" not in str(info.value)
    assert "AKIDEXAMPLE" not in str(info.value)


def test_list_open_read_and_delete_skip_temp_files(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    body = b"0123456789"
    store.put_if_absent(
        "chunks/a.parquet", body, sha256=hashlib.sha256(body).hexdigest(), content_type="x"
    )
    (tmp_path / "chunks" / ".b.parquet.tmp-1-0123456789abcdef").write_bytes(b"partial")
    assert [(i.key, i.size_bytes) for i in store.list("chunks/")] == [("chunks/a.parquet", 10)]
    assert list(store.list("manifests/")) == []
    with store.open_read("chunks/a.parquet") as fh:
        fh.seek(4)
        assert fh.read(3) == b"456"
    store.delete("chunks/a.parquet")
    store.delete("chunks/a.parquet")
    assert list(store.list("chunks/")) == []
