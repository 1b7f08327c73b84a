"""The LanceDB sink (embedded: a directory, no socket)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from adapters.sinks import open_sink
from embedline.errors import FatalError


def _rows(ids: list[str], dims: int = 4, seed: int = 0) -> pa.Table:
    vectors = np.random.default_rng(seed).random((len(ids), dims), dtype=np.float32)
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dims),
            "text_sha256": pa.array([f"h{i}" for i in ids], pa.string()),
        }
    )


def _contents(sink) -> dict[str, tuple[list[float], str]]:
    table = sink._open().to_arrow()
    return {
        i: (v, r)
        for i, v, r in zip(
            table.column("id").to_pylist(),
            table.column("embedding").to_pylist(),
            table.column("run_key").to_pylist(),
            strict=True,
        )
    }


def test_lancedb_upsert_is_idempotent_and_replace_deletes_other_runs(tmp_path: Path) -> None:
    sink = open_sink(f"lancedb://{tmp_path}")
    sink.ensure_table(embedder="openai", model="m", dimensions=4)
    first = _rows(["a", "b", "c"])
    assert sink.upsert(first, run_key="r1").rows == 3
    assert sink.upsert(first, run_key="r1").rows == 3  # a reloaded chunk: no duplicate rows
    assert sorted(_contents(sink)) == ["a", "b", "c"]
    second = _rows(["b", "c", "d"], seed=1)
    sink.upsert(second, run_key="r2")
    assert sink.delete_other_runs("r2") == 1  # "a" is not in run r2
    got = _contents(sink)
    assert sorted(got) == ["b", "c", "d"]
    expected = dict(
        zip(second.column("id").to_pylist(), second.column("embedding").to_pylist(), strict=True)
    )
    assert all(np.array_equal(got[i][0], expected[i]) and got[i][1] == "r2" for i in got)
    assert sink.delete_ids(["b", "it's-absent"]) == 1
    sink.finalize()
    assert sorted(_contents(sink)) == ["c", "d"]


def test_lancedb_search_returns_the_nearest_id_first(tmp_path: Path) -> None:
    sink = open_sink(f"lancedb://{tmp_path}")
    sink.ensure_table(embedder="openai", model="m", dimensions=4)
    rows = _rows([f"id{i}" for i in range(50)], seed=3)
    sink.upsert(rows, run_key="r")
    target = np.asarray(rows.column("embedding")[17].as_py(), dtype=np.float32)
    hits = sink.search(target, 3)
    assert hits[0][0] == "id17" and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert len(hits) == 3 and hits[0][1] >= hits[1][1] >= hits[2][1]


def test_lancedb_mismatch_names_both_models_and_lengths(tmp_path: Path) -> None:
    sink = open_sink(f"lancedb://{tmp_path}?table=t")
    sink.ensure_table(embedder="openai", model="text-embedding-3-small", dimensions=4)
    again = open_sink(f"lancedb://{tmp_path}?table=t")
    with pytest.raises(FatalError) as caught:
        again.ensure_table(embedder="local", model="all-MiniLM-L6-v2", dimensions=384)
    message = str(caught.value)
    for part in ("text-embedding-3-small", "4-dimension", "all-MiniLM-L6-v2", "384-dimension"):
        assert part in message
    assert caught.value.exit_code == 3
    with pytest.raises(FatalError, match="model other"):
        again.ensure_table(embedder="openai", model="other", dimensions=4)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("90s", 90.0), ("30m", 1800.0), ("1h", 3600.0), ("7d", 604800.0), ("12", 12.0)],
)
def test_lancedb_keep_versions_durations(text: str, seconds: float) -> None:
    from cli.load import duration_s

    assert duration_s(text) == seconds


def test_lancedb_keeps_columns_and_their_hash_and_refuses_other_columns(tmp_path: Path) -> None:
    from embedline.protocols import SinkColumns
    from embedline.template import kept_sha256

    sink = open_sink(f"lancedb://{tmp_path}?table=docs")
    columns = SinkColumns(("title", "Section name"), text=True)
    sink.ensure_table(embedder="openai", model="m", dimensions=4, columns=columns)
    rows = _rows(["a", "b"])
    for name, values in (
        ("title", ["T'a", "Tb"]),
        ("Section name", ["s1", "s2"]),
        ("text", ["text a", "text b"]),
    ):
        rows = rows.append_column(name, pa.array(values, pa.string()))
    assert sink.upsert(rows, run_key="r1").rows == 2
    held = sink.held_keys().to_pylist()
    assert held == [
        {"id": "a", "text_sha256": "ha", "kept_sha256": kept_sha256(["T'a", "s1"])},
        {"id": "b", "text_sha256": "hb", "kept_sha256": kept_sha256(["Tb", "s2"])},
    ]
    hits = sink.search(
        np.asarray(rows.column("embedding")[0].as_py()), 1, columns=["title", "Section name"]
    )
    assert hits[0][0] == "a" and hits[0][2:] == ("T'a", "s1")
    assert sink.describe().columns == columns
    again = open_sink(f"lancedb://{tmp_path}?table=docs")
    with pytest.raises(
        FatalError,
        match=r"keeps 'title', 'Section name', the text, but this "
        r"run keeps 'title'",
    ):
        again.ensure_table(
            embedder="openai", model="m", dimensions=4, columns=SinkColumns(("title",))
        )


def test_a_path_the_system_refuses_is_one_fatal_line_naming_the_sink(tmp_path: Path) -> None:
    """Lance's IO errors (a table directory that is a file, a database path under a file,
    a directory it may not write) were tracebacks ending a run after its commit; they are
    one ``FatalError`` (exit 3) naming the sink and the system's reason."""
    from adapters.sinks.lancedb import LanceDBSink, _os_refusals
    from embedline.errors import FatalError

    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "t.lance").write_text("not a table")
    (tmp_path / "file").write_text("not a directory")
    calls = [
        lambda: LanceDBSink(str(tmp_path / "db"), table="t").describe(),
        lambda: LanceDBSink(str(tmp_path / "db"), table="t").ensure_table(
            embedder="openai", model="m", dimensions=4
        ),
        lambda: LanceDBSink(str(tmp_path / "file" / "db"), table="t").describe(),
    ]
    for call in calls:
        with pytest.raises(FatalError, match=r"^LanceDB sink lancedb://.*Not a directory") as err:
            call()
        assert err.value.exit_code == 3 and "\n" not in str(err.value)
    lance_said = (
        "lance error: LanceError(IO): Operation not permitted (os error 1), "
        "/root/.cargo/registry/src/x/lance-io-13.0.0/src/object_store.rs:1000:21"
    )
    with pytest.raises(FatalError) as err, _os_refusals("lancedb://d?table=t"):
        raise RuntimeError(lance_said)
    assert str(err.value).startswith(
        "LanceDB sink lancedb://d?table=t: Operation not permitted (os error 1); check"
    )
    with pytest.raises(RuntimeError, match="commit conflict"), _os_refusals("x"):
        raise RuntimeError("Retryable commit conflict (os error 11)")
