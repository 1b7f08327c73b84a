"""A second night's delta into an HNSW-indexed pgvector table, through the sink adapter, on a
real PostgreSQL: every batch is COPYed once into a stage table and upserted by one statement,
and nothing is left on the server connection between transactions (a pooler in transaction
mode, PgBouncer, may hand the next transaction another server connection)."""

from __future__ import annotations

import hashlib

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from pgvector.psycopg import register_vector

from adapters.sinks.pgvector import PgVectorSink
from embedline.protocols import SinkColumns
from embedline.template import kept_sha256
from tests.support.fake_openai import expected_matrix

pytestmark = [pytest.mark.integration]

DIMS = 384
COLUMNS = SinkColumns(("title",), text=True)


def _rows(texts: dict[str, str], titles: dict[str, str]) -> pa.Table:
    """Rows as a chunk object holds them, vectors the fake server's for each text."""
    ids = list(texts)
    matrix = expected_matrix([texts[i] for i in ids], DIMS)
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), DIMS),
            "text_sha256": pa.array([hashlib.sha256(texts[i].encode()).hexdigest() for i in ids]),
            "title": pa.array([titles[i] for i in ids], pa.string()),
            "text": pa.array([texts[i] for i in ids], pa.string()),
        }
    )


def _upsert(sink: PgVectorSink, texts: dict[str, str], titles: dict[str, str], run: str) -> None:
    ids = list(texts)
    for start in range(0, len(ids), 64):  # several batches, as chunks arrive
        part = ids[start : start + 64]
        result = sink.upsert(
            _rows({i: texts[i] for i in part}, {i: titles[i] for i in part}), run_key=run
        )
        assert result.rows == len(part) and result.refused == ()


def test_a_delta_into_an_indexed_table_updates_adds_and_deletes_exactly(pg_uri: str) -> None:
    sink = PgVectorSink(pg_uri, table="delta")
    sink.ensure_table(embedder="openai", model="fake", dimensions=DIMS, columns=COLUMNS)
    ids = [f"row-{i:04d}" for i in range(300)]
    texts = {i: f"the first text of {i}" for i in ids}
    titles = {i: f"title of {i}" for i in ids}
    runs = dict.fromkeys(ids, "night-1")
    _upsert(sink, texts, titles, "night-1")
    assert sink.finalize() == "HNSW index built"

    text_edits = {i: f"the second text of {i}" for i in ids[:100]}
    title_edits = {i: f"new title of {i}" for i in ids[100:150]}  # metadata only
    added = {f"new-{i:04d}": f"a new text {i}" for i in range(80)}
    removed = ids[250:290]
    delta_texts = text_edits | {i: texts[i] for i in title_edits} | added
    texts |= text_edits | added
    titles |= title_edits | {i: f"title of {i}" for i in added}
    runs |= dict.fromkeys(delta_texts, "night-2")
    _upsert(sink, delta_texts, {i: titles[i] for i in delta_texts}, "night-2")
    assert sink.delete_ids(removed) == len(removed)
    for i in removed:
        del texts[i], titles[i], runs[i]

    with psycopg.connect(pg_uri) as conn:
        register_vector(conn)
        got = conn.execute(
            "SELECT id, embedding, text_sha256, run_key, kept_sha256, title, text FROM delta"
        ).fetchall()
        index = conn.execute("SELECT to_regclass('delta_embedding_hnsw')").fetchone()[0]
    assert index is not None
    assert sorted(r[0] for r in got) == sorted(texts)
    want = dict(zip(texts, expected_matrix(list(texts.values()), DIMS), strict=True))
    for row_id, vector, sha, run, kept, title, text in got:
        assert np.array_equal(np.asarray(vector.to_numpy(), np.float32), want[row_id]), row_id
        assert sha == hashlib.sha256(texts[row_id].encode()).hexdigest(), row_id
        assert (run, title, text) == (runs[row_id], titles[row_id], texts[row_id]), row_id
        assert kept == kept_sha256([titles[row_id]]), row_id
    edited = ids[7]
    top = sink.search(want[edited], 1, columns=("title",))
    assert top[0][0] == edited and top[0][2] == titles[edited]
    sink.close()


def test_upserts_leave_no_prepared_statement_or_stage_table_on_the_connection(
    pg_uri: str,
) -> None:
    sink = PgVectorSink(pg_uri, table="pooled")
    sink.ensure_table(embedder="openai", model="fake", dimensions=DIMS, columns=COLUMNS)
    for night in range(8):  # psycopg prepares a statement on its 5th execution by default
        texts = {f"id-{i}": f"text {i} night {night}" for i in range(10)}
        sink.upsert(_rows(texts, dict.fromkeys(texts, "t")), run_key=f"night-{night}")
        sink.held_keys()
    conn = sink._connection()
    with conn.transaction():
        prepared = conn.execute("SELECT name FROM pg_prepared_statements").fetchall()
        stage = conn.execute("SELECT to_regclass('pg_temp.embedline_stage')").fetchone()[0]
    assert prepared == [] and stage is None
    sink.close()
