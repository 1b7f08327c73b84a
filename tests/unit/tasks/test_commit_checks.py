"""The last check before a commit: chunk objects deleted under a running run are found,
by a HEAD each for a few objects and by one listing of ``chunks/`` for many."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from adapters.object_store import open_store
from embedline.models import ChunkOutcome
from tasks.commit import missing_objects


@pytest.mark.parametrize("chunks", [3, 70])  # below and above the listing threshold
def test_deleted_chunk_objects_are_missing_whatever_their_number(tmp_path: Path,
                                                                 chunks: int) -> None:
    store = open_store(str(tmp_path / "out"))
    store.prepare()
    done = {}
    for i in range(chunks):
        key = f"chunks/{i:064x}.parquet"
        body = f"object {i}".encode()
        store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(),
                            content_type="application/octet-stream")
        done[i] = ChunkOutcome(index=i, key=f"{i:064x}", object_key=key, object_sha256="",
                               rows=1)
    gone = [done[1].object_key, done[chunks - 1].object_key]
    for key in gone:
        (tmp_path / "out" / key).unlink()
    assert missing_objects(store, done) == sorted(gone)
