"""Change sets against the previous committed run, computed from chunk objects on disk."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adapters.object_store import LocalDirStore
from embedline.errors import ConflictError
from embedline.keys import text_sha256
from tasks.commit.changes import write_changes
from tasks.commit.manifest import latest_manifest, read_manifest


def _chunk(store: LocalDirStore, name: str, rows: list[tuple[str, str]]) -> dict[str, object]:
    """Store a chunk-shaped object (id, text_sha256) and return its manifest entry."""
    table = pa.table({"id": [r for r, _ in rows], "text_sha256": [text_sha256(t) for _, t in rows]})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    body = sink.getvalue()
    key = f"chunks/{name}.parquet"
    store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="x")
    return {"object": key, "rows": len(rows)}


def _manifest(
    store: LocalDirStore,
    run_key: str,
    chunks: list[dict[str, object]],
    created_at: str,
    **fields: object,
) -> dict[str, object]:
    manifest = {
        "format": "embedline.manifest.v1",
        "run_key": run_key,
        "chunks": chunks,
        "id_column": "id",
        "text_column": "text",
        "model": "m",
        "dimensions": 3,
        "created_at": created_at,
        **fields,
    }
    body = json.dumps(manifest).encode()
    store.put_if_absent(
        f"manifests/{run_key}.json", body, sha256=hashlib.sha256(body).hexdigest(), content_type="x"
    )
    return manifest


def _changes(store: LocalDirStore, key: str) -> dict[str, tuple[str, str]]:
    table = pq.read_table(store.uri_for(key))
    ids = table["id"].to_pylist()
    assert ids == sorted(ids)
    return {
        i: (c, h)
        for i, c, h in zip(
            ids, table["change"].to_pylist(), table["text_sha256"].to_pylist(), strict=True
        )
    }


def test_change_set_has_added_changed_removed_and_counts_unchanged(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    shared = _chunk(store, "shared", [("a", "alpha"), ("b", "beta")])
    old = _chunk(store, "old", [("c", "gamma"), ("d", "delta"), ("e", "eps")])
    base = _manifest(store, "r1", [shared, old], "2026-01-01T00:00:00Z")
    new = _chunk(store, "new", [("c", "gamma"), ("d", "DELTA"), ("f", "phi")])
    counts = write_changes(
        store, run_key="r2", chunks=[shared, new], base=base, scratch_dir=tmp_path
    )
    assert (counts.added, counts.changed, counts.removed, counts.unchanged) == (1, 1, 1, 3)
    assert counts.base_run_key == "r1" and counts.object == "changes/r2.parquet"
    assert _changes(store, counts.object) == {
        "d": ("changed", text_sha256("DELTA")),
        "e": ("removed", text_sha256("eps")),
        "f": ("added", text_sha256("phi")),
    }


def test_first_run_is_all_added_and_rewriting_is_idempotent(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    chunk = _chunk(store, "c1", [("x", "one"), ("y", "two")])
    first = write_changes(store, run_key="r1", chunks=[chunk], base=None, scratch_dir=tmp_path)
    assert (first.added, first.changed, first.removed, first.unchanged) == (2, 0, 0, 0)
    assert first.base_run_key is None
    # an attempt that died before its manifest: the rerun keeps the object it finds
    other = _manifest(store, "r0", [], "2026-01-02T00:00:00Z")
    again = write_changes(store, run_key="r1", chunks=[chunk], base=other, scratch_dir=tmp_path)
    assert again == first


def test_latest_manifest_orders_v1_and_v2_times_and_filters_columns(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    _manifest(store, "a", [], "2026-01-01T00:00:05Z")
    _manifest(store, "b", [], "2026-01-01T00:00:05.250000Z", format="embedline.manifest.v2")
    _manifest(store, "c", [], "2026-01-03T00:00:00Z", text_column="other")
    assert read_manifest(store, "b") is not None  # v2 reads; v1 ("a") too
    assert latest_manifest(store, id_column="id", text_column="text")["run_key"] == "b"
    assert latest_manifest(store, text_column="text", exclude_run_key="b")["run_key"] == "a"
    assert latest_manifest(store)["run_key"] == "c"
    assert latest_manifest(store, model="other") is None


def _kept_chunk(
    store: LocalDirStore, name: str, rows: list[tuple[str, str, str]]
) -> dict[str, object]:
    """A chunk object with a kept column ``title``: rows are (id, text, title)."""
    table = pa.table(
        {
            "id": [r[0] for r in rows],
            "text_sha256": [text_sha256(r[1]) for r in rows],
            "title": [r[2] for r in rows],
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    body = sink.getvalue()
    key = f"chunks/{name}.parquet"
    store.put_if_absent(key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="x")
    return {"object": key, "rows": len(rows)}


def test_a_kept_value_edit_is_changed_without_a_text_change(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    old = _kept_chunk(
        store,
        "old",
        [("a", "alpha", "A"), ("b", "beta", "B"), ("c", "gamma", "C"), ("d", "delta", "D")],
    )
    base = _manifest(store, "r1", [old], "2026-01-01T00:00:00Z", kept_columns=["title"])
    new = _kept_chunk(
        store,
        "new",
        [("a", "alpha", "A"), ("b", "beta", "B (renamed)"), ("c", "GAMMA", "C"), ("e", "eps", "E")],
    )
    counts = write_changes(
        store, run_key="r2", chunks=[new], base=base, kept_columns=["title"], scratch_dir=tmp_path
    )
    assert (counts.added, counts.changed, counts.removed, counts.unchanged) == (1, 2, 1, 1)
    table = pq.read_table(store.uri_for(counts.object)).to_pylist()
    assert [(r["id"], r["change"], r["text_changed"]) for r in table] == [
        ("b", "changed", False),
        ("c", "changed", True),
        ("d", "removed", None),
        ("e", "added", None),
    ]
    # without kept columns the same objects only see the text change
    plain = write_changes(store, run_key="r3", chunks=[new], base=base, scratch_dir=tmp_path)
    assert (plain.added, plain.changed, plain.removed) == (1, 1, 1)


def test_an_existing_change_set_of_another_run_is_a_conflict(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "out")
    chunk = _chunk(store, "c1", [("x", "one")])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    theirs = write_changes(store, run_key="r0", chunks=[chunk], base=None, scratch_dir=scratch)
    # the other run's object under this run's key (never written so by embedline)
    body = store.get(theirs.object)
    store.put_if_absent("changes/r1.parquet", body, sha256=theirs.sha256, content_type="x")
    store.put_if_absent(
        "changes/r2.parquet",
        b"not parquet",
        sha256=hashlib.sha256(b"not parquet").hexdigest(),
        content_type="x",
    )

    for run_key in ("r1", "r2"):
        with pytest.raises(ConflictError, match="already holds other bytes"):
            write_changes(store, run_key=run_key, chunks=[chunk], base=None, scratch_dir=scratch)
    assert list(scratch.iterdir()) == []


def test_a_rerun_keeps_its_change_set_without_reading_the_chunks(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "out")
    chunk = _chunk(store, "c1", [("x", "one"), ("y", "two")])
    first = write_changes(store, run_key="r1", chunks=[chunk], base=None, scratch_dir=tmp_path)
    store.delete(str(chunk["object"]))  # a diff would need it

    again = write_changes(store, run_key="r1", chunks=[chunk], base=None, scratch_dir=tmp_path)

    assert again == first
