"""Model cutover without downtime: ``embedline load --to URI --alias NAME`` loads each model's
run into a table of its own, checks it, then switches NAME in one step; ``--rollback`` goes
back. A reader searching through NAME in a loop while the cutover happens never sees an
error, an empty table or a result mixing the two models (pgvector); Qdrant's local mode
switches its collection alias the same way."""

from __future__ import annotations

import csv
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgvector.psycopg import register_vector

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.in_process import run_in_process

pytestmark = pytest.mark.integration

ROWS = [(f"pkg-{i:03d}", f"package {i}: tools for task {i * 7}\nline two") for i in range(60)]
MODELS = {"model-a": 16, "model-b": 32}  # a model and its vector length
QUERY = "tools for task 140"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeEmbeddingServer]:
    """The fake embeddings server of this module's runs and searches."""
    with FakeEmbeddingServer() as fake:
        yield fake


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, server: FakeEmbeddingServer, prefect_api_url: str
) -> tuple[Path, dict[str, str]]:
    """One committed run per model of the same CSV, in a directory the tests share (each
    test loads into stores of its own); returns (directory, model -> run key). In process:
    preconditions (the loads under test go through the CLI)."""
    where = tmp_path_factory.mktemp("cutover")
    with (where / "in.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows([("id", "text"), *ROWS])
    keys = {}
    for model, dims in MODELS.items():
        keys[model] = str(
            run_in_process(
                prefect_api_url,
                input=str(where / "in.csv"),
                embedder="openai",
                base_url=server.base_url,
                model=model,
                dimensions=dims,
                output=str(where / "out"),
                ledger=str(where / "ledger.sqlite3"),
                chunk_size=20,
            )["run_key"]
        )
    return where, keys


def _load(tmp_path: Path, run_key: str, to: str, *extra: str) -> Any:
    return run_cli(
        "load",
        run_key,
        "--to",
        to,
        "--output",
        "out",
        "--ledger",
        "ledger.sqlite3",
        "--alias",
        "docs",
        *extra,
        cwd=tmp_path,
    )


def _top5(dims: int) -> list[str]:
    """The true top 5 ids for QUERY under the model of ``dims`` (the fake's vectors)."""
    query = expected_vector(QUERY, dims)
    scores = [(float(expected_vector(text, dims) @ query), row_id) for row_id, text in ROWS]
    return [row_id for _, row_id in sorted(scores, key=lambda s: (-s[0], s[1]))[:5]]


def _ids(search_output: str) -> list[str]:
    """The ids of ``embedline search``'s result lines (``rank score id …``)."""
    return [
        line.split()[2]
        for line in search_output.splitlines()
        if line.split() and line.split()[0].isdigit()
    ]


class _Reader(threading.Thread):
    """Searches through the view ``docs`` in a loop as docs/reference/sinks.md tells an application
    to: one transaction per search that first touches the view (its lock then holds a
    switch back until the search is done), reads the model from the view's comment (which
    query vector to send), then asks for the top 5. Records each result's model, and any
    error."""

    def __init__(self, pg_uri: str) -> None:
        super().__init__(daemon=True)
        self.pg_uri = pg_uri
        self.stop = threading.Event()
        self.seen: list[tuple[str, list[str]]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        with psycopg.connect(self.pg_uri, autocommit=True) as conn:
            register_vector(conn)
            while not self.stop.is_set():
                try:
                    with conn.transaction():
                        conn.execute("SELECT 1 FROM docs LIMIT 0")
                        comment = conn.execute(
                            "SELECT obj_description('docs'::regclass, 'pg_class')"
                        ).fetchone()[0]
                        model = next(m for m in MODELS if f'"{m}"' in comment)
                        rows = conn.execute(
                            "SELECT id FROM docs ORDER BY embedding <=> %s, id LIMIT 5",
                            (expected_vector(QUERY, MODELS[model]),),
                        ).fetchall()
                    self.seen.append((model, [r[0] for r in rows]))
                except Exception as exc:  # noqa: BLE001 - any error is the finding
                    self.errors.append(f"{type(exc).__name__}: {exc}")


def test_cutover_through_a_view_never_shows_readers_an_error_or_a_mix_and_rolls_back(
    runs: tuple[Path, dict[str, str]], server: FakeEmbeddingServer, pg_uri: str
) -> None:
    tmp_path, keys = runs
    first = _load(tmp_path, keys["model-a"], pg_uri)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "alias      docs -> docs__model_a_16 (new)" in first.stdout

    reader = _Reader(pg_uri)
    reader.start()
    try:
        second = _load(tmp_path, keys["model-b"], pg_uri)
        assert second.returncode == 0, second.stderr[-2000:]
        assert (
            "alias      docs -> docs__model_b_32 (was docs__model_a_16; --rollback restores it)"
        ) in second.stdout
        while not any(model == "model-b" for model, _ in reader.seen[-3:]):
            assert reader.is_alive() and not reader.errors, reader.errors[:3]
    finally:
        reader.stop.set()
        reader.join(timeout=30)
    assert reader.errors == []
    truth = {model: _top5(dims) for model, dims in MODELS.items()}
    assert all(ids == truth[model] for model, ids in reader.seen), reader.seen[:5]
    models = [model for model, _ in reader.seen]
    switch_at = models.index("model-b")
    assert switch_at > 0 and set(models[switch_at:]) == {"model-b"}  # one switch, no flapping

    with psycopg.connect(pg_uri) as conn:  # both tables are kept for the rollback
        counts = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("docs__model_a_16", "docs__model_b_32", "docs")
        }
    assert counts == {"docs__model_a_16": 60, "docs__model_b_32": 60, "docs": 60}

    back = run_cli("load", "--to", pg_uri, "--alias", "docs", "--rollback", cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    assert "docs -> docs__model_a_16 (rolled back from docs__model_b_32)" in back.stdout
    searched = run_cli(
        "search",
        f"{pg_uri}&table=docs" if "?" in pg_uri else f"{pg_uri}?table=docs",
        QUERY,
        "--k",
        "5",
        "--base-url",
        server.base_url,
        cwd=tmp_path,
    )
    assert searched.returncode == 0, searched.stderr
    assert _ids(searched.stdout) == truth["model-a"]


def test_cutover_refusals_lancedb_and_a_table_named_like_the_alias(
    runs: tuple[Path, dict[str, str]], pg_uri: str
) -> None:
    tmp_path, keys = runs
    lance = _load(tmp_path, keys["model-a"], f"lancedb://{tmp_path / 'lance'}")
    assert lance.returncode == 2 and "lancedb has no aliases or views" in lance.stderr
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS taken (id text)")
    refused = run_cli(
        "load",
        keys["model-a"],
        "--to",
        pg_uri,
        "--output",
        "out",
        "--ledger",
        "ledger.sqlite3",
        "--alias",
        "taken",
        cwd=tmp_path,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "'taken' exists and is not an alias embedline made" in refused.stderr
    with psycopg.connect(pg_uri) as conn:  # refused before the load: nothing was loaded
        assert conn.execute("SELECT to_regclass('taken__model_a_16')").fetchone()[0] is None
    bad = run_cli("load", "--to", pg_uri, "--alias", "never-made", "--rollback", cwd=tmp_path)
    assert bad.returncode == 2
    assert "--alias 'never-made': a PostgreSQL alias is a view" in bad.stderr
    never = run_cli("load", "--to", pg_uri, "--alias", "never_made", "--rollback", cwd=tmp_path)
    assert never.returncode == 2 and "does not exist: nothing to roll back" in never.stderr


def test_cutover_on_qdrant_local_switches_the_collection_alias_and_rolls_back(
    runs: tuple[Path, dict[str, str]], server: FakeEmbeddingServer
) -> None:
    from qdrant_client import QdrantClient

    tmp_path, keys = runs
    to = f"qdrant+local://{tmp_path / 'qdrant'}"
    for model in MODELS:
        loaded = _load(tmp_path, keys[model], to)
        assert loaded.returncode == 0, loaded.stderr[-2000:]
    client = QdrantClient(path=str(tmp_path / "qdrant"))
    try:
        aliases = {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
        assert aliases == {"docs": "docs__model_b_32"}
        assert client.get_collection("docs").config.params.vectors.size == 32
        assert client.count("docs", exact=True).count == 60
    finally:
        client.close()
    back = run_cli("load", "--to", to, "--alias", "docs", "--rollback", cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    searched = run_cli(
        "search",
        f"{to}?collection=docs",
        QUERY,
        "--k",
        "5",
        "--base-url",
        server.base_url,
        cwd=tmp_path,
    )
    assert searched.returncode == 0, searched.stderr
    assert _ids(searched.stdout) == _top5(16)
