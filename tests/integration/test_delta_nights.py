"""Delta nights: a chain of nights with adds, text edits, metadata-only edits, deletes and
empty texts writes only what changed, and every night reads back exactly — through a plain
reader of the manifest (each object without the ids its entry drops), through
``read_embeddings`` and after ``gc`` — with vectors checked against the fake server's
deterministic vectors, never against embedline's earlier output.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_matrix
from tests.support.fixtures import REPO, run_cli
from tests.support.output import vectors_by_id

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

Rows = list[tuple[str, str, str]]  # id, text, section (a kept column)


class Nights:
    """One output root and ledger; ``run(rows)`` rewrites the CSV and runs the CLI."""

    def __init__(self, tmp: Path, server: FakeEmbeddingServer) -> None:
        self.tmp, self.server = tmp, server
        self.out = tmp / "out"

    def args(self, rows: Rows, *extra: str) -> list[str]:
        """Write ``rows`` as the night's CSV; the command line that runs it."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(("id", "text", "section"))
        writer.writerows(rows)
        (self.tmp / "in.csv").write_text(buf.getvalue(), encoding="utf-8")
        return [
            "run", "in.csv", "--embedder", "openai", "--base-url", self.server.base_url,
            "--output", str(self.out), "--ledger", "ledger.sqlite3", "--chunk-size", "40",
            "--keep-columns", "section", *extra,
        ]  # fmt: skip

    def run(self, rows: Rows, *extra: str) -> tuple[int, dict[str, Any]]:
        """(inputs the server was sent, the committed manifest) of one night."""
        self.server.reset()
        result = run_cli(*self.args(rows, *extra), cwd=self.tmp)
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.splitlines()
        uri = next(line.split()[-1] for line in lines if line.startswith("manifest"))
        return self.server.counters()["inputs"], json.loads(Path(uri).read_text())

    def check(self, manifest: dict[str, Any], rows: Rows) -> None:
        """Every id with a non-empty text has the server's vector for its text and its
        section, read as a plain reader and through ``read_embeddings``."""
        from tasks.load.read_run import read_embeddings

        bodies = {e["object"]: (self.out / e["object"]).read_bytes() for e in manifest["chunks"]}
        vectors = vectors_by_id(bodies, manifest)
        live = [r for r in rows if r[1].strip()]
        assert sorted(vectors) == sorted(r[0] for r in live)
        got = np.stack([vectors[r[0]] for r in live])
        assert np.allclose(got, expected_matrix([r[1] for r in live]), rtol=1e-6, atol=1e-7)
        frame = read_embeddings(str(self.out), manifest["run_key"])
        assert dict(zip(frame["id"], frame["section"], strict=True)) == {r[0]: r[2] for r in live}
        assert manifest["rows_published"] + manifest["rows_failed"] == len(rows)

    def load(self, manifest: dict[str, Any], rows: Rows) -> None:
        """Load the night into a LanceDB table; it then holds exactly the night's rows."""
        import lancedb

        sink = f"lancedb://{self.tmp / 'db'}?table=pkgs"
        result = run_cli(
            "load", manifest["run_key"], "--to", sink, "--output", str(self.out),
            "--ledger", "ledger.sqlite3", cwd=self.tmp,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        held = lancedb.connect(self.tmp / "db").open_table("pkgs").to_arrow().to_pylist()
        live = [r for r in rows if r[1].strip()]
        assert sorted(r["id"] for r in held) == sorted(r[0] for r in live)
        by_id = {r["id"]: r for r in held}
        got = np.stack([np.asarray(by_id[r[0]]["embedding"], dtype=np.float32) for r in live])
        assert np.allclose(got, expected_matrix([r[1] for r in live]), rtol=1e-6, atol=1e-7)
        assert all(by_id[r[0]]["section"] == r[2] for r in live)

    def changes(self, manifest: dict[str, Any]) -> dict[str, list[str]]:
        table = pq.read_table(self.out / manifest["changes"]["object"])
        out: dict[str, list[str]] = {"added": [], "changed": [], "removed": []}
        for row in table.to_pylist():
            out[row["change"]].append(row["id"])
        return out

    def chunk_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.out / "chunks").iterdir())


def _first(n: int) -> Rows:
    return [(f"pkg-{i:04d}", f"package {i} does thing {i % 17}", f"s{i % 5}") for i in range(n)]


def test_a_chain_of_delta_nights_writes_only_changes_and_reads_back_exactly(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    nights = Nights(tmp_path, fake_openai)
    rows = _first(400)  # 10 planned chunks
    charged, first = nights.run(rows)
    assert charged == len({r[1] for r in rows})
    nights.check(first, rows)
    nights.load(first, rows)
    full_bytes = nights.chunk_bytes()

    pick = random.Random(3).sample(range(400), 12)  # scattered over every chunk
    edited, meta_only, gone = pick[:4], pick[4:8], pick[8:11]
    emptied = pick[11]
    rows2 = list(rows)
    for i in edited:
        rows2[i] = (rows[i][0], rows[i][1] + " (edited)", rows[i][2])
    for i in meta_only:
        rows2[i] = (rows[i][0], rows[i][1], "moved")
    rows2[emptied] = (rows[emptied][0], "  ", rows[emptied][2])
    rows2 = [r for i, r in enumerate(rows2) if i not in gone]
    rows2.insert(57, ("pkg-new-a", "a brand new package", "s9"))
    rows2.append(("pkg-new-b", "another new package", "s9"))
    charged, second = nights.run(rows2)
    assert charged == 6, "only the edited and new texts are sent"
    nights.check(second, rows2)
    nights.load(second, rows2)
    assert nights.changes(second) == {
        "added": ["pkg-new-a", "pkg-new-b"],
        "changed": sorted(rows[i][0] for i in edited + meta_only),
        "removed": sorted([rows[i][0] for i in gone] + [rows[emptied][0]]),
    }
    before = {c["object"] for c in first["chunks"]}
    written = [e for e in second["chunks"] if e["object"] not in before]
    assert [e["rows"] for e in written] == [10], "one delta object of the 10 rows to write"
    dropped = sorted(i for e in second["chunks"] for i in e.get("drop_ids", ()))
    assert dropped == sorted(rows[i][0] for i in edited + meta_only + gone + [emptied])
    assert nights.chunk_bytes() - full_bytes < 0.1 * full_bytes

    rows3 = [(r[0], r[1] + " v3", r[2]) if n % 50 == 7 else r for n, r in enumerate(rows2)]
    charged, third = nights.run(rows3)
    assert charged == sum(1 for n in range(len(rows2)) if n % 50 == 7)
    nights.check(third, rows3)
    nights.load(third, rows3)
    assert third["changes"]["base_run_key"] == second["run_key"]

    result = run_cli("gc", str(nights.out), "--keep-runs", "1", "--grace", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    nights.check(third, rows3)  # gc kept every object the delta chain needs

    _, again = nights.run(rows3, "--compact")
    assert again["run_key"] == third["run_key"], "the same input is the same, committed run"
    rows4 = [*rows3, ("pkg-new-c", "one more package", "s1")]
    charged, fourth = nights.run(rows4, "--compact")
    assert charged == 1
    assert not any(e.get("drop_ids") for e in fourth["chunks"]), "--compact writes whole objects"
    nights.check(fourth, rows4)


def _chunk_files(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "chunks").iterdir()}


def _kill_at_random(nights: Nights, args: list[str], rng: random.Random, kills: int) -> None:
    """Start ``args`` and kill -9 it at a random moment, ``kills`` times; no chunk object
    is ever rewritten."""
    seen = _chunk_files(nights.out)
    for _ in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            cwd=nights.tmp,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(1.0, 6.0))  # start-up, planning, the delta, dispatch, commit
        proc.kill()
        proc.wait()
        files = _chunk_files(nights.out)
        assert {k: files.get(k) for k in seen} == seen, "a chunk object was rewritten"
        seen = files


def test_kill_9_at_random_points_of_a_delta_night_and_of_a_compaction(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """Every retained run stays readable whatever moment a night or a compaction dies at,
    and the rerun commits exactly."""
    nights = Nights(tmp_path, fake_openai)
    rows = _first(480)
    _, first = nights.run(rows)
    rng = random.Random(11)
    edited = sorted(rng.sample(range(480), 90))  # scattered: delta chunks of 40, 40 and 10 rows
    rows2 = [(r[0], r[1] + " (night 2)", r[2]) if i in edited else r for i, r in enumerate(rows)]
    fake_openai.fail_when(lambda payload: {"delay_s": 0.4})  # a request takes its time
    args = [*nights.args(rows2), "--batch-size", "4", "--concurrency", "2"]
    _kill_at_random(nights, args, rng, kills=3)
    nights.check(first, rows)  # the run before it reads back as it was
    fake_openai.fail_when(lambda payload: None)
    _, second = nights.run(rows2, "--batch-size", "4")
    nights.check(second, rows2)
    assert any(e.get("drop_ids") for e in second["chunks"]), "the night is a delta"

    rows3 = [*rows2, ("pkg-last", "the last package", "s2")]
    fake_openai.fail_when(lambda payload: {"delay_s": 0.4})
    args = [*nights.args(rows3, "--compact"), "--batch-size", "4", "--concurrency", "2"]
    _kill_at_random(nights, args, rng, kills=3)
    nights.check(second, rows2)
    nights.check(first, rows)
    fake_openai.fail_when(lambda payload: None)
    _, third = nights.run(rows3, "--compact")
    nights.check(third, rows3)
    assert not any(e.get("drop_ids") for e in third["chunks"])
