"""The last check before a commit: chunk objects deleted under a running run are found,
by a HEAD each for a few objects and by one listing of ``chunks/`` for many."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import pytest

from adapters.object_store import open_store
from embedline.models import ChunkOutcome
from embedline.settings import RunSettings
from tasks.commit.commit_run import commit_run, missing_objects
from tests.support.chunks import CountingStore, plan_rows, publish_truth


@pytest.mark.parametrize("chunks", [3, 70])  # below and above the listing threshold
def test_deleted_chunk_objects_are_missing_whatever_their_number(
    tmp_path: Path, chunks: int
) -> None:
    store = open_store(str(tmp_path / "out"))
    store.prepare()
    done = {}
    for i in range(chunks):
        key = f"chunks/{i:064x}.parquet"
        body = f"object {i}".encode()
        store.put_if_absent(
            key,
            body,
            sha256=hashlib.sha256(body).hexdigest(),
            content_type="application/octet-stream",
        )
        done[i] = ChunkOutcome(index=i, key=f"{i:064x}", object_key=key, object_sha256="", rows=1)
    gone = [done[1].object_key, done[chunks - 1].object_key]
    for key in gone:
        (tmp_path / "out" / key).unlink()
    assert missing_objects(store, done) == sorted(gone)


def test_a_night_with_the_same_rows_commits_an_empty_change_set_without_reading_them(
    tmp_path: Path,
) -> None:
    """Same (id, text) pairs in another order and other chunks: the run's fingerprint (the
    XOR of its row keys, from the chunk objects' metadata) equals the base's, so the change
    set is empty and no chunk object is read for it; one edited text and it is diffed."""

    def night(name: str, rows: list[tuple[str, str]], size: int) -> dict[str, Any]:
        plan = plan_rows(tmp_path, name, rows, size)
        local = open_store(str(tmp_path / "out"))
        local.prepare()
        done = publish_truth(local, plan)
        store = CountingStore(local)
        settings = RunSettings(
            input=str(tmp_path / name),
            output=str(tmp_path / "out"),
            embedder="openai",
            model="m",
            dimensions=8,
            ledger=str(tmp_path / "l.sqlite3"),
        )
        made = commit_run(
            store, settings=settings, plan=plan, run_key=name[0] * 64, done=done, rows_failed=0
        )
        return {
            "manifest": made.manifest,
            "changes": made.changes,
            "chunk_reads": sum(n for k, n in store.opened.items() if k.startswith("chunks/")),
        }

    rows = [(f"p{i}", f"text {i}") for i in range(60)]
    first = night("a.csv", rows, 10)
    assert first["changes"].added == 60 and first["manifest"]["rows_xor"]
    shuffled = list(rows)
    random.Random(2).shuffle(shuffled)
    same = night("b.csv", shuffled, 7)
    assert same["manifest"]["rows_xor"] == first["manifest"]["rows_xor"]
    assert (
        same["changes"].added,
        same["changes"].changed,
        same["changes"].removed,
        same["changes"].unchanged,
    ) == (0, 0, 0, 60)
    assert same["chunk_reads"] == 0  # before: every id of both runs was read and sorted
    shuffled[3] = (shuffled[3][0], "an edited text")
    edited = night("c.csv", shuffled, 7)
    assert edited["manifest"]["rows_xor"] != same["manifest"]["rows_xor"]
    assert (edited["changes"].changed, edited["chunk_reads"] > 0) == (1, True)
