"""Search that says how exact it is: ``search --exact`` returns the true top k, filtered or
not, on every target; ``embedline recall`` prints the recall@k an independent count gives;
a search through a cutover alias embeds its query with the model and at the server of the
run its table holds, even with an OpenAI key in the environment.

The truth is numpy over the fake server's deterministic vectors (``expected_matrix``): random
directions, the worst case for an HNSW index, so pgvector's index search can miss some of
the true top 10 that ``--exact`` must return.
"""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

from tests.support.fake_openai import FakeEmbeddingServer, expected_matrix, expected_vector
from tests.support.fixtures import run_cli
from tests.support.loopback_http import LoopbackRecorder

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

ROWS = 3000
QUERY = "a tool that reads tables of numbers"


def _text(n: int) -> str:
    return f"package {n}: utilities for task {n * 7 % 1009}, release {n % 13}"


def _group(n: int) -> str:
    return f"group {n % 100}"  # 30 rows (1 %) each


DOCS = [{"id": f"pkg-{n:05d}", "grp": _group(n), "text": _text(n)} for n in range(ROWS)]


class Loaded:
    """One run (its output root and ledger) loaded into pgvector (HNSW index built),
    LanceDB and Qdrant's local mode."""

    def __init__(self, cwd: Path, server: FakeEmbeddingServer, targets: dict[str, str]) -> None:
        self.cwd, self.server, self.targets = cwd, server, targets

    def cli(self, *args: str, **kwargs: Any) -> Any:
        return run_cli(*args, cwd=self.cwd, **kwargs)


def _with_table(pg_uri: str, table: str) -> str:
    return f"{pg_uri}{'&' if '?' in pg_uri else '?'}table={table}"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory, pg_uri: str) -> Iterator[Loaded]:
    cwd = tmp_path_factory.mktemp("exact")
    with open(cwd / "in.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=("id", "grp", "text"), lineterminator="\n")
        writer.writeheader()
        writer.writerows(DOCS)
    targets = {
        "output root": str(cwd / "out"),
        "pgvector": _with_table(pg_uri, "exact_docs"),
        "lancedb": f"lancedb://{cwd / 'db'}?table=exact_docs",
        "qdrant": f"qdrant+local://{cwd / 'qdrant'}?collection=exact_docs",
    }
    with FakeEmbeddingServer() as server:
        common = ("--output", targets["output root"], "--ledger", "ledger.sqlite3")
        result = run_cli(
            "run",
            "in.csv",
            "--embedder",
            "openai",
            "--base-url",
            server.base_url,
            "--chunk-size",
            "1000",
            "--batch-size",
            "1000",
            "--keep-columns",
            "grp",
            "--sink",
            targets["pgvector"],
            *common,
            cwd=cwd,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        for kind in ("lancedb", "qdrant"):
            load = run_cli("load", "--to", targets[kind], *common, cwd=cwd, timeout=600)
            assert load.returncode == 0, load.stdout[-2000:] + load.stderr[-3000:]
        with psycopg.connect(pg_uri) as conn:
            index = conn.execute("SELECT to_regclass('exact_docs_embedding_hnsw')").fetchone()[0]
        assert index is not None  # the index --exact must not use is there
        yield Loaded(cwd, server, targets)


def _truth(query: np.ndarray, k: int, where: str | None = None) -> list[str]:
    """The true top k ids for the vector ``query`` among the rows of group ``where``."""
    rows = [d for d in DOCS if where is None or d["grp"] == where]
    scores = expected_matrix([d["text"] for d in rows]).astype(np.float64) @ query.astype(
        np.float64
    )
    return [rows[i]["id"] for i in np.argsort(-scores, kind="stable")[:k]]


def _ids(output: str) -> list[str]:
    """The ids of ``search``'s result lines (``rank score id …``)."""
    return [line.split()[2] for line in output.splitlines() if line.split()[0].isdigit()]


@pytest.mark.parametrize("target", ["output root", "pgvector", "lancedb", "qdrant"])
@pytest.mark.parametrize("where", [None, "group 42"])
def test_exact_returns_the_true_top_10_filtered_or_not(
    loaded: Loaded, target: str, where: str | None
) -> None:
    filters = ("--where", f"grp={where}") if where else ()
    found = loaded.cli(
        "search",
        loaded.targets[target],
        QUERY,
        "--exact",
        *filters,
        "--base-url",
        loaded.server.base_url,
        "--ledger",
        "ledger.sqlite3",
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.splitlines()[0].split()[:3] == ["rank", "score", "id"]
    assert _ids(found.stdout) == _truth(expected_vector(QUERY), 10, where)


def test_pgvector_exact_search_never_plans_the_hnsw_index(loaded: Loaded, pg_uri: str) -> None:
    """The exact query (a ``MATERIALIZED`` CTE) keeps the index out of the plan, with no
    ``SET`` of planner switches: the session's settings stay as they were."""
    from psycopg import sql

    from adapters.sinks.pg_search import filtered_search

    with psycopg.connect(pg_uri) as conn:
        register_vector(conn)
        explained: list[str] = []
        original = conn.execute

        def execute(query: Any, params: Any = None) -> Any:
            text = query.as_string(conn) if hasattr(query, "as_string") else str(query)
            if "ORDER BY" in text:
                plan = original(sql.SQL("EXPLAIN ") + query, params).fetchall()
                explained.append("\n".join(r[0] for r in plan))
            return original(query, params)

        conn.execute = execute  # type: ignore[method-assign]
        hits = filtered_search(
            conn,
            sql.Identifier("exact_docs"),
            '"exact_docs_embedding_hnsw"',
            expected_vector(QUERY),
            10,
            exact=True,
        )
        settings = original("SELECT current_setting('enable_indexscan')").fetchone()[0]
    assert [h[0] for h in hits] == _truth(expected_vector(QUERY), 10)
    assert explained and all("hnsw" not in plan for plan in explained), explained
    assert settings == "on"


def _recall_line(output: str) -> tuple[int, int, int]:
    found = re.search(
        r"^recall@10  (\d\.\d{3}) over (\d+) queries: search found (\d+) of the (\d+) "
        r"true nearest",
        output,
        re.M,
    )
    assert found, output
    value, queries, hits, true = found.groups()
    assert abs(float(value) - int(hits) / int(true)) < 5e-4
    return int(queries), int(hits), int(true)


def test_recall_prints_what_an_independent_count_gives(loaded: Loaded, pg_uri: str) -> None:
    measured = loaded.cli("recall", loaded.targets["pgvector"], "--queries", "20", "--seed", "7")
    assert measured.returncode == 0, measured.stderr[-2000:]
    assert measured.stdout.count("\n") == 1  # one line

    # the same sample (the sorted ids, random.Random(seed).sample), each row's vector as the
    # query; the index's hits through plain SQL, the truth from numpy; the row itself left out
    by_id = {d["id"]: d for d in DOCS}
    sample = random.Random(7).sample(sorted(by_id), 20)
    hits = true = 0
    with psycopg.connect(pg_uri) as conn:
        register_vector(conn)
        for row_id in sample:
            query = expected_vector(by_id[row_id]["text"])
            got = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM exact_docs ORDER BY embedding <=> %s LIMIT 11", (query,)
                ).fetchall()
                if r[0] != row_id
            ][:10]
            wanted = [i for i in _truth(query, 11) if i != row_id][:10]
            hits += len(set(got) & set(wanted))
            true += len(wanted)
    assert _recall_line(measured.stdout) == (20, hits, true)

    # exact stores, a selective filter (pgvector scans it exactly), an output root: all found
    for target, extra in [
        ("lancedb", ()),
        ("qdrant", ()),
        ("pgvector", ("--where", "grp=group 42")),
        ("output root", ()),
    ]:
        line = loaded.cli("recall", loaded.targets[target], "--queries", "5", *extra)
        assert line.returncode == 0, line.stderr[-2000:]
        queries, found, wanted = _recall_line(line.stdout)
        assert queries == 5 and found == wanted == 50, (target, line.stdout)
    assert "always searched exactly" in line.stdout
    unknown = loaded.cli("recall", loaded.targets["pgvector"], "--where", "Grp=1")
    assert unknown.returncode == 2 and "'Grp'" in unknown.stderr


ALIAS_ROWS = [(f"a-{i:03d}", f"alias row {i}: tools for task {i * 7}") for i in range(60)]
ALIAS_QUERY = "tools for task 140"


def _alias_top5(dims: int) -> list[str]:
    query = expected_vector(ALIAS_QUERY, dims)
    scores = [(float(expected_vector(t, dims) @ query), i) for i, t in ALIAS_ROWS]
    return [i for _, i in sorted(scores, key=lambda s: (-s[0], s[1]))[:5]]


@pytest.mark.parametrize(
    "store",
    [
        "pgvector",
        pytest.param("qdrant", marks=pytest.mark.slow),
    ],  # CI's 20-minute budget: make test-all runs it
)
def test_search_through_an_alias_embeds_with_the_alias_tables_run(
    tmp_path: Path, pg_uri: str, store: str
) -> None:
    """Two runs of two models, each at its own server, loaded behind one alias: a search
    through the alias (no --base-url, an OpenAI key set) asks the server and model of the
    run whose table the alias points at, before and after a rollback."""
    with open(tmp_path / "in.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows([("id", "text"), *ALIAS_ROWS])
    to = pg_uri if store == "pgvector" else f"qdrant+local://{tmp_path / 'qdrant'}"
    alias = "cut_" + store
    env = {"OPENAI_API_KEY": "sk-test-not-for-api-openai-com"}
    with FakeEmbeddingServer() as first, FakeEmbeddingServer() as second:
        for server, model, dims in ((first, "model-a", 16), (second, "model-b", 32)):
            made = run_cli(
                "run",
                "in.csv",
                "--embedder",
                "openai",
                "--base-url",
                server.base_url,
                "--model",
                model,
                "--dimensions",
                str(dims),
                "--output",
                "out",
                "--ledger",
                "ledger.sqlite3",
                cwd=tmp_path,
            )
            assert made.returncode == 0, made.stderr[-2000:]
            cut = run_cli(
                "load",
                "--to",
                to,
                "--output",
                "out",
                "--ledger",
                "ledger.sqlite3",
                "--alias",
                alias,
                cwd=tmp_path,
            )
            assert cut.returncode == 0, cut.stderr[-2000:]
        through = _with_table(pg_uri, alias) if store == "pgvector" else f"{to}?collection={alias}"

        def search() -> Any:
            return run_cli(
                "search",
                through,
                ALIAS_QUERY,
                "--k",
                "5",
                "--ledger",
                "ledger.sqlite3",
                cwd=tmp_path,
                env=env,
                timeout=120,
            )

        before = second.counters()["requests"]
        found = search()
        assert found.returncode == 0, found.stderr[-2000:]
        assert _ids(found.stdout) == _alias_top5(32)
        assert second.counters()["requests"] == before + 1

        back = run_cli("load", "--to", to, "--alias", alias, "--rollback", cwd=tmp_path)
        assert back.returncode == 0, back.stderr
        before = first.counters()["requests"]
        found = search()
        assert found.returncode == 0, found.stderr[-2000:]
        assert _ids(found.stdout) == _alias_top5(16)
        assert first.counters()["requests"] == before + 1


def test_exact_on_a_qdrant_server_sends_exact_search_params() -> None:
    """No Qdrant server ships on PyPI: a loopback recorder answers as one would, and the
    request says ``"exact": true`` with --exact, nothing without."""
    from adapters.sinks import open_sink

    body = {"result": {"points": []}, "status": "ok", "time": 0.0}
    with LoopbackRecorder(status=200, body=body) as server:
        sink = open_sink(f"qdrant://127.0.0.1:{server.port}/packages")
        try:
            assert sink.search(np.ones(4, np.float32), 3, exact=True) == []
            assert sink.search(np.ones(4, np.float32), 3) == []
        finally:
            sink.close()
        exact, plain = [b for b in server.json_bodies() if isinstance(b, dict) and "query" in b]
    assert exact["params"]["exact"] is True
    assert not (plain.get("params") or {}).get("exact")
