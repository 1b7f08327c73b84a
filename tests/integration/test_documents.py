"""Documents, not just vectors (issue 23 items 1-3), on real Debian rows through the CLI.

- the text from a template over several columns (placeholders, ``{{ }}`` escapes, ``\\n`` on
  the command line) is what is embedded, hashed and reused: a template change is a new text;
- unknown placeholders or kept columns stop the run before any request (exit 2);
- kept columns reach chunk objects, ``read_embeddings`` and the LanceDB, pgvector and Qdrant
  (local mode) sinks, value by value as in the CSV;
- editing a kept column that is not in the template charges 0 inputs, is ``changed`` with
  ``text_changed`` False in the change set, and reaches each sink in mode ``changes``;
- a sink table keeping other columns is refused (exit 3, naming both);
- a kept value never appears in the output, logs or ledger of a failing run.

Every vector is checked against the fake server's deterministic vector of the expected text.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import embedline
from embedline.keys import text_sha256
from tests.support.csv_data import ENGLISH
from tests.support.fake_openai import FakeEmbeddingServer, expected_matrix
from tests.support.fixtures import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

Doc = dict[str, str]
COLUMNS = ("id", "title", "section", "text")


def _docs(limit: int) -> list[Doc]:
    """The first ``limit`` English rows with their real title, and a made-up section."""
    with open(ENGLISH, newline="", encoding="utf-8") as fh:
        rows = [r for _, r in zip(range(limit), csv.DictReader(fh), strict=False)]
    return [
        {"id": r["id"], "title": r["title"], "section": f"section {n % 7}", "text": r["text"]}
        for n, r in enumerate(rows)
    ]


def _write(path: Path, docs: list[Doc]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(docs)
    return path


class Night:
    """One output root and ledger; ``run(docs, *flags)`` rewrites the CSV and runs the CLI."""

    def __init__(self, tmp: Path, server: FakeEmbeddingServer) -> None:
        self.tmp, self.server = tmp, server
        self.output = tmp / "out"

    def run(self, docs: list[Doc], *flags: str, expect: int = 0) -> tuple[int, str, str]:
        """Return (inputs the server was sent, stdout, stderr)."""
        self.server.reset()
        _write(self.tmp / "in.csv", docs)
        result = run_cli(
            "run",
            str(self.tmp / "in.csv"),
            "--embedder",
            "openai",
            "--base-url",
            self.server.base_url,
            "--output",
            str(self.output),
            "--ledger",
            str(self.tmp / "ledger.sqlite3"),
            "--chunk-size",
            "100",
            "--batch-size",
            "256",
            "--allow-failed-rows",
            *flags,
            cwd=self.tmp,
        )
        assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-3000:]
        return self.server.counters()["inputs"], result.stdout, result.stderr

    def manifest(self, stdout: str) -> dict[str, Any]:
        uri = next(line.split()[-1] for line in stdout.splitlines() if line.startswith("manifest"))
        return dict(json.loads(Path(uri).read_text()))

    def changes(self, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        body = (self.output / manifest["changes"]["object"]).read_bytes()
        return list(pq.read_table(io.BytesIO(body)).to_pylist())


def _vectors_match(ids: list[str], vectors: list[Any], texts_by_id: dict[str, str]) -> None:
    expected = expected_matrix([texts_by_id[i] for i in ids])
    got = np.stack([np.asarray(v, dtype=np.float32) for v in vectors])
    wrong = [ids[k] for k in np.flatnonzero(~np.isclose(got, expected, atol=1e-6).all(axis=1))]
    assert not wrong, f"{len(wrong)} ids hold another text's vector, e.g. {wrong[:3]}"


def test_a_template_is_the_text_embedded_hashed_and_reused(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    docs = [d for d in _docs(240) if d["text"].strip()]
    night = Night(tmp_path, fake_openai)
    # as typed in a shell's single quotes: \n is backslash + n; {{ }} are literal braces
    template = ["--text-template", r"{{{title}}}\n\n{text}"]
    composed = {d["id"]: "{" + d["title"] + "}\n\n" + d["text"] for d in docs}
    plain = {d["id"]: d["text"] for d in docs}

    charged, out, _ = night.run(docs, *template)
    manifest = night.manifest(out)
    assert charged == len(set(composed.values()))
    assert manifest["text_template"] == "{{{title}}}\n\n{text}"
    table = embedline.read_embeddings_arrow(str(night.output))
    ids = table.column("id").to_pylist()
    _vectors_match(ids, table.column("embedding").to_pylist(), composed)
    hashes = dict(zip(ids, table.column("text_sha256").to_pylist(), strict=True))
    assert hashes == {i: text_sha256(t) for i, t in composed.items()}

    # the plain column is another text: nothing of the template's run is reused
    charged, out, _ = night.run(docs, "--text-column", "text")
    assert charged == len(set(plain.values()))
    assert night.manifest(out)["run_key"] != manifest["run_key"]
    table = embedline.read_embeddings_arrow(str(night.output))
    _vectors_match(table.column("id").to_pylist(), table.column("embedding").to_pylist(), plain)

    # the template again, rows in another order (new chunks): every vector is reused
    charged, out, _ = night.run(docs[::-1], *template)
    assert charged == 0
    table = embedline.read_embeddings_arrow(str(night.output))
    _vectors_match(table.column("id").to_pylist(), table.column("embedding").to_pylist(), composed)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--text-template", r"{title}\n{body}"], "'body'"),
        (["--keep-columns", "title,Section"], "'Section'"),
    ],
)
def test_an_unknown_column_is_an_input_error_before_any_request(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, flags: list[str], named: str
) -> None:
    night = Night(tmp_path, fake_openai)
    _, _, err = night.run(_docs(20), *flags, expect=2)
    assert named in err, err
    assert "columns found: 'id', 'title', 'section', 'text'" in err, err
    assert fake_openai.counters()["requests"] == 0


def test_a_kept_column_under_a_reserved_name_is_an_input_error(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    night = Night(tmp_path, fake_openai)
    _, _, err = night.run(_docs(20), "--keep-columns", "title,text", "--keep-text", expect=2)
    assert "'text'" in err and "--keep-text" in err, err
    _, _, err = night.run(_docs(20), "--keep-columns", "text_sha256", expect=2)
    assert "'text_sha256'" in err, err
    assert fake_openai.counters()["requests"] == 0


def _sink_rows(
    kind: str, sink: str, pg_uri: str, table: str, columns: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """``{id: {"embedding": …, column: value, …}}`` as the sink holds it."""
    if kind == "pgvector":
        import psycopg
        from pgvector.psycopg import register_vector
        from psycopg import sql

        with psycopg.connect(pg_uri) as conn:
            register_vector(conn)
            names = sql.SQL(", ").join(map(sql.Identifier, ("id", "embedding", *columns)))
            rows = conn.execute(
                sql.SQL("SELECT {} FROM {}").format(names, sql.Identifier(table))
            ).fetchall()
        records = [dict(zip(("id", "embedding", *columns), r, strict=True)) for r in rows]
        for record in records:
            record["embedding"] = record["embedding"].to_numpy()
    elif kind == "qdrant":
        from qdrant_client import QdrantClient

        from tests.support.qdrant_local import qdrant_path

        client = QdrantClient(path=qdrant_path(sink))
        try:
            points, _ = client.scroll(table, limit=10**6, with_payload=True, with_vectors=True)
        finally:
            client.close()
        records = [
            {
                "id": p.payload["id"],
                "embedding": np.asarray(p.vector, dtype=np.float32),
                **{c: p.payload.get(c) for c in columns},
            }
            for p in points
        ]
    else:
        import lancedb

        records = (
            lancedb.connect(sink[len("lancedb://") :].split("?")[0])
            .open_table(table)
            .to_arrow()
            .select(["id", "embedding", *columns])
            .to_pylist()
        )
    by_id = {r["id"]: r for r in records}
    assert len(by_id) == len(records), "an id appears twice"
    return by_id


@pytest.mark.parametrize(
    "kind",
    [
        "lancedb",
        "pgvector",
        pytest.param("qdrant", marks=pytest.mark.slow),
    ],  # CI's 20-minute budget: make test-all runs it
)
def test_kept_columns_reach_every_output_and_a_metadata_edit_costs_nothing(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, request: pytest.FixtureRequest, kind: str
) -> None:
    pg_uri = request.getfixturevalue("pg_uri") if kind == "pgvector" else ""
    table = f"docs_{kind}"
    sink = {
        "pgvector": f"{pg_uri}{'&' if '?' in pg_uri else '?'}table={table}",
        "qdrant": f"qdrant+local://{tmp_path / 'qdrant'}?collection={table}",
        "lancedb": f"lancedb://{tmp_path / 'db'}?table={table}",
    }[kind]
    docs = [d for d in _docs(300) if d["text"].strip()]
    night = Night(tmp_path, fake_openai)
    flags = ["--keep-columns", "title,section", "--keep-text", "--sink", sink]
    charged, out, _ = night.run(docs, *flags)
    assert charged == len({d["text"] for d in docs})
    manifest = night.manifest(out)
    assert manifest["kept_columns"] == ["title", "section"] and manifest["keep_text"] is True
    by_id = {d["id"]: d for d in docs}

    # chunk objects: embedline's columns, then the kept ones and the text, value by value
    for entry in manifest["chunks"]:
        chunk = pq.read_table(night.output / entry["object"])
        assert chunk.column_names == [
            "id",
            "embedding",
            "text_sha256",
            "idempotency_key",
            "title",
            "section",
            "text",
        ]
        for row in chunk.select(["id", "title", "section", "text"]).to_pylist():
            assert row == {c: by_id[row["id"]][c] for c in ("id", "title", "section", "text")}
    # read_embeddings (pandas) and its Arrow twin
    frame = embedline.read_embeddings(str(night.output))
    assert list(frame.columns) == ["id", "embedding", "text_sha256", "title", "section", "text"]
    assert frame[["id", "title", "section", "text"]].to_dict("records") == [
        {c: d[c] for c in ("id", "title", "section", "text")} for d in docs
    ]
    assert embedline.read_embeddings_arrow(str(night.output)).column("title").to_pylist() == [
        d["title"] for d in docs
    ]
    # the sink
    held = _sink_rows(kind, sink, pg_uri, table, ("title", "section", "text"))
    assert {i: (r["title"], r["section"], r["text"]) for i, r in held.items()} == {
        d["id"]: (d["title"], d["section"], d["text"]) for d in docs
    }
    _vectors_match(
        list(held),
        [r["embedding"] for r in held.values()],
        {i: d["text"] for i, d in by_id.items()},
    )
    # search prints the titles after rank, score and id
    found = run_cli(
        "search",
        sink,
        docs[5]["text"],
        "--k",
        "3",
        "--base-url",
        fake_openai.base_url,
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        cwd=tmp_path,
    )
    assert found.returncode == 0, found.stderr[-2000:]
    lines = found.stdout.splitlines()
    assert lines[0].split() == ["rank", "score", "id", "title", "section"]
    first = lines[1].split(None, 3)
    assert first[:3] == ["1", "1.000", docs[5]["id"]]
    assert first[3].startswith(docs[5]["title"].split()[0])

    # a metadata-only night: 40 sections edited (not in the text) → 0 inputs, in the sink
    edited = [
        dict(d, section=f"{d['section']} (moved {n})") if n % 7 == 3 else d
        for n, d in enumerate(docs)
    ]
    moved = {d["id"] for d, e in zip(docs, edited, strict=True) if d != e}
    charged, out, _ = night.run(edited, *flags)
    assert charged == 0, "a metadata-only edit must not send any text"
    manifest = night.manifest(out)
    assert (
        manifest["changes"]["changed"],
        manifest["changes"]["added"],
        manifest["changes"]["removed"],
    ) == (len(moved), 0, 0)
    changes = night.changes(manifest)
    assert {c["id"] for c in changes} == moved
    assert {c["change"] for c in changes} == {"changed"}
    assert {c["text_changed"] for c in changes} == {False}
    assert re.search(r"^load +loaded .*mode changes", out, re.M), out
    assert re.search(rf"^rows +{len(moved)} upserted now", out, re.M), out
    held = _sink_rows(kind, sink, pg_uri, table, ("title", "section", "text"))
    assert {i: r["section"] for i, r in held.items()} == {d["id"]: d["section"] for d in edited}
    _vectors_match(
        list(held),
        [r["embedding"] for r in held.values()],
        {i: d["text"] for i, d in by_id.items()},
    )

    # a text edit of one row: text_changed True, one input
    texted = [dict(d, text=d["text"] + " (edited)") if n == 11 else d for n, d in enumerate(edited)]
    charged, out, _ = night.run(texted, *flags)
    assert charged == 1
    assert [(c["id"], c["text_changed"]) for c in night.changes(night.manifest(out))] == [
        (texted[11]["id"], True)
    ]

    # a table keeping other columns is refused, naming both (exit 3)
    charged, out, err = night.run(texted, "--keep-columns", "title", "--sink", sink, expect=3)
    said = out + err
    assert "'title', 'section' and the text" in said or "'title', 'section', the text" in said, said
    assert "this run keeps 'title'" in said, said


def test_a_kept_value_never_appears_in_a_failing_runs_output_or_ledger(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    secret = "kept-value-7f3a9c-never-logged"
    docs = [d for d in _docs(120) if d["text"].strip()]
    docs[7] = dict(docs[7], title=secret, text=docs[7]["text"] + " REJECTME")
    docs[60] = dict(docs[60], section=secret)
    fake_openai.reject_texts_containing = "REJECTME"
    night = Night(tmp_path, fake_openai)
    _write(tmp_path / "in.csv", docs)
    result = run_cli(
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        str(night.output),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "50",
        "--keep-columns",
        "title,section",
        "--debug",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr[-3000:]  # a dead letter: not committed
    assert "1 row is a dead letter" in result.stdout + result.stderr
    assert secret not in result.stdout + result.stderr
    assert secret.encode() not in (tmp_path / "ledger.sqlite3").read_bytes()
    listed = run_cli(
        "dead-letters",
        _run_key(result.stdout),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        cwd=tmp_path,
    )
    assert docs[7]["id"] in listed.stdout and secret not in listed.stdout + listed.stderr

    # and a fatal stop (401) of the same input
    fake_openai.reset()
    fake_openai.script([{"status": 401}] * 20)
    failed = run_cli(
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        str(tmp_path / "out2"),
        "--ledger",
        str(tmp_path / "ledger2.sqlite3"),
        "--chunk-size",
        "50",
        "--keep-columns",
        "title,section",
        "--debug",
        cwd=tmp_path,
    )
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert secret not in failed.stdout + failed.stderr
    assert secret.encode() not in (tmp_path / "ledger2.sqlite3").read_bytes()


def _run_key(stdout: str) -> str:
    match = re.search(r"^run +([0-9a-f]{64})", stdout, re.M)
    assert match, stdout
    return match.group(1)
