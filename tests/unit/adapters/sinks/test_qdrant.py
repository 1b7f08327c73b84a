"""The Qdrant sink in qdrant-client's local mode (a directory, no server, no socket)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("qdrant_client")

from adapters.sinks import open_sink
from adapters.sinks.qdrant import POINT_NAMESPACE, point_id
from embedline.errors import FatalError, RetryableError


def _rows(ids: list[str], dims: int = 4, seed: int = 0) -> pa.Table:
    vectors = np.random.default_rng(seed).random((len(ids), dims), dtype=np.float32) + 0.01
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dims),
            "text_sha256": pa.array([f"h{i}" for i in ids], pa.string()),
        }
    )


def _unit(rows: pa.Table) -> dict[str, np.ndarray]:
    out = {}
    for i, v in zip(
        rows.column("id").to_pylist(), rows.column("embedding").to_pylist(), strict=True
    ):
        v = np.asarray(v, dtype=np.float32)
        out[i] = v / np.linalg.norm(v)
    return out


def _points(sink) -> dict[str, tuple[np.ndarray, dict]]:
    points, _ = sink._client().scroll(
        sink.collection, limit=100_000, with_payload=True, with_vectors=True
    )
    return {
        p.payload["id"]: (np.asarray(p.vector, dtype=np.float32), p.payload, p.id) for p in points
    }


def test_point_ids_are_uuid5_of_the_csv_id_in_a_fixed_namespace() -> None:
    assert point_id("0ad") == str(uuid.uuid5(POINT_NAMESPACE, "0ad"))
    assert str(POINT_NAMESPACE) == str(uuid.uuid5(uuid.NAMESPACE_URL, "embedline:qdrant:point-id"))
    assert point_id("a\x00b") != point_id("a")  # any string, NUL included, is an id


def test_qdrant_upsert_is_idempotent_keeps_the_csv_id_and_replace_deletes_other_runs(
    tmp_path: Path,
) -> None:
    sink = open_sink(f"qdrant+local://{tmp_path}/q?collection=t")
    sink.ensure_table(embedder="openai", model="m", dimensions=4)
    first = _rows(["a", "b", "c", "it's"])
    assert sink.upsert(first, run_key="r1").rows == 4
    assert sink.upsert(first, run_key="r1").rows == 4  # a reloaded chunk: no duplicates
    got = _points(sink)
    assert sorted(got) == ["a", "b", "c", "it's"]
    want = _unit(first)
    for row_id, (vector, payload, pid) in got.items():
        assert pid == point_id(row_id)
        assert payload == {"id": row_id, "text_sha256": f"h{row_id}", "run_key": "r1"}
        assert np.allclose(vector, want[row_id], atol=1e-6)  # Cosine stores unit vectors
    held = sink.held_keys()
    assert sorted(
        zip(held.column("id").to_pylist(), held.column("text_sha256").to_pylist(), strict=True)
    ) == sorted((i, f"h{i}") for i in ["a", "b", "c", "it's"])
    second = _rows(["b", "c", "d"], seed=1)
    sink.upsert(second, run_key="r2")
    assert sink.delete_other_runs("r2") == 2  # "a" and "it's" are not in run r2
    assert sorted(_points(sink)) == ["b", "c", "d"]
    assert sink.delete_ids(["b", "absent"]) == 1
    sink.finalize()
    assert sorted(_points(sink)) == ["c", "d"]
    assert sink.describe().rows == 2
    sink.close()


def test_qdrant_refuses_a_non_finite_vector_and_removes_the_old_point_under_its_id(
    tmp_path: Path,
) -> None:
    sink = open_sink(f"qdrant+local://{tmp_path}")
    sink.ensure_table(embedder="openai", model="m", dimensions=4)
    sink.upsert(_rows(["a", "b"]), run_key="r1")
    bad = _rows(["a", "b"], seed=2)
    vectors = np.asarray(bad.column("embedding").combine_chunks().flatten()).reshape(2, 4).copy()
    vectors[0, 1] = np.nan
    bad = bad.set_column(
        1, "embedding", pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 4)
    )
    result = sink.upsert(bad, run_key="r2")
    assert result.rows == 1
    assert [(r[0], r[1], r[2]) for r in result.refused] == [(0, "a", "non_finite_vector")]
    assert sorted(_points(sink)) == ["b"]  # no stale vector under "a"
    sink.close()


def test_qdrant_search_returns_the_nearest_csv_id_first(tmp_path: Path) -> None:
    sink = open_sink(f"qdrant+local://{tmp_path}")
    sink.ensure_table(embedder="openai", model="m", dimensions=4)
    rows = _rows([f"id{i}" for i in range(50)], seed=3)
    sink.upsert(rows, run_key="r")
    target = np.asarray(rows.column("embedding")[17].as_py(), dtype=np.float32)
    hits = sink.search(target, 3)
    assert hits[0][0] == "id17" and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert len(hits) == 3 and hits[0][1] >= hits[1][1] >= hits[2][1]
    sink.close()


def test_qdrant_mismatch_names_both_models_and_lengths(tmp_path: Path) -> None:
    sink = open_sink(f"qdrant+local://{tmp_path}?collection=t")
    sink.ensure_table(embedder="openai", model="text-embedding-3-small", dimensions=4)
    sink.close()
    again = open_sink(f"qdrant+local://{tmp_path}?collection=t")
    with pytest.raises(FatalError) as caught:
        again.ensure_table(embedder="local", model="all-MiniLM-L6-v2", dimensions=384)
    message = str(caught.value)
    for part in ("text-embedding-3-small", "4-dimension", "all-MiniLM-L6-v2", "384-dimension"):
        assert part in message
    assert "another collection (?collection=NAME)" in message and "?table=" not in message
    assert caught.value.exit_code == 3
    again.close()


def test_a_collection_of_another_distance_is_refused_before_any_point_is_sent(
    tmp_path: Path,
) -> None:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(tmp_path))
    client.create_collection(
        "dot", vectors_config=models.VectorParams(size=4, distance=models.Distance.DOT)
    )
    client.close()
    sink = open_sink(f"qdrant+local://{tmp_path}?collection=dot")
    with pytest.raises(FatalError) as caught:
        sink.ensure_table(embedder="openai", model="m", dimensions=4)
    assert "distance Dot, not Cosine" in str(caught.value) and caught.value.exit_code == 3
    sink.close()


def test_a_second_process_on_the_same_local_directory_is_told_to_rerun(tmp_path: Path) -> None:
    first = open_sink(f"qdrant+local://{tmp_path}")
    first.ensure_table(embedder="openai", model="m", dimensions=4)
    second = open_sink(f"qdrant+local://{tmp_path}")
    with pytest.raises(RetryableError) as caught:
        second.describe()
    assert "another process" in str(caught.value) and caught.value.exit_code == 1
    first.close()  # released: now it opens
    assert second.describe() is not None
    second.close()


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_more_than_20000_points_in_local_mode_do_not_warn(tmp_path: Path) -> None:
    # pytest turns warnings into errors here: qdrant-client's "Local mode is not
    # recommended for collections with more than 20,000 points" would fail this test
    sink = open_sink(f"qdrant+local://{tmp_path}")
    sink.ensure_table(embedder="openai", model="m", dimensions=2)
    rows = _rows([str(i) for i in range(20_050)], dims=2)
    assert sink.upsert(rows, run_key="r").rows == 20_050
    sink.finalize()
    sink.close()
    reopened = open_sink(f"qdrant+local://{tmp_path}")
    assert reopened.describe().rows == 20_050  # opening a big collection warns too
    reopened.close()


def test_client_for_lends_the_sinks_one_client_with_its_error_translation(
    tmp_path: Path,
) -> None:
    """What ``QdrantAlias`` uses: the sink's own client (a local directory opens once per
    process), and a failure inside is embedline's error, naming the operation."""
    sink = open_sink(f"qdrant+local://{tmp_path / 'q'}?collection=c")
    try:
        with sink.client_for("read aliases of") as first:
            with sink.client_for("switch alias of") as second:
                assert first is second
            assert first.get_aliases().aliases == []
        with (
            pytest.raises(RetryableError, match=r"^read aliases of .*another process"),
            sink.client_for("read aliases of"),
        ):
            raise RuntimeError("Storage folder q is already accessed by another instance")
    finally:
        sink.close()
