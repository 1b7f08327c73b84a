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
from tests.support.forked_cli import popen_cli
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
    # the emptied text is in no chunk of a delta night: still the run's dead letter
    listed = run_cli("dead-letters", second["run_key"], "--ledger", "ledger.sqlite3", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert listed.stdout.splitlines() == [f"{rows[emptied][0]}\tempty_text\t"]
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

    charged, again = nights.run(rows3, "--compact")
    assert charged == 0, "a compaction of the same input sends nothing"
    assert (again["generation"], again["supersedes"]) == (1, third["run_key"])
    assert not any(e.get("drop_ids") for e in again["chunks"]), "--compact writes whole objects"
    nights.check(again, rows3)
    _, still = nights.run(rows3, "--compact")
    assert still["run_key"] == again["run_key"], "compacted: the same, committed run"
    said = run_cli(*nights.args(rows3, "--compact"), cwd=tmp_path).stdout
    assert "nothing to do (--compact: its objects hold no dropped rows)" in said
    rows4 = [*rows3, ("pkg-new-c", "one more package", "s1")]
    charged, fourth = nights.run(rows4, "--compact")
    assert charged == 1
    assert not any(e.get("drop_ids") for e in fourth["chunks"]), "--compact writes whole objects"
    nights.check(fourth, rows4)


def test_an_earlier_nights_input_run_again_becomes_the_latest_run_exactly(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """An export reverted to an earlier night's (the same bytes, or the same rows gzipped)
    was "already complete" under its old run key: the output, its readers and the sink kept
    the later night. It is committed again as the next generation of its run: the latest
    run, with its change set against the night before, nothing sent."""
    import gzip

    from tasks.load.read_run import read_embeddings

    nights = Nights(tmp_path, fake_openai)
    rows_a = _first(120)
    _, night_a = nights.run(rows_a)
    rows_b = [(r[0], r[1] + " (b)", r[2]) if i % 9 == 4 else r for i, r in enumerate(rows_a)]
    rows_b = [r for i, r in enumerate(rows_b) if i % 31 != 6] + [("pkg-b-new", "new in b", "s1")]
    _, night_b = nights.run(rows_b)
    nights.load(night_b, rows_b)

    charged, again_a = nights.run(rows_a)
    assert charged == 0
    assert (again_a["generation"], again_a["supersedes"]) == (1, night_a["run_key"])
    assert any(e.get("drop_ids") for e in again_a["chunks"]), "a delta of night b"
    nights.check(again_a, rows_a)
    nights.load(again_a, rows_a)
    latest = read_embeddings(str(nights.out))  # the default run: the latest committed
    assert sorted(latest["id"]) == sorted(r[0] for r in rows_a)
    assert again_a["changes"]["base_run_key"] == night_b["run_key"]
    b_ids, a_ids = {r[0] for r in rows_b}, {r[0] for r in rows_a}
    assert nights.changes(again_a) == {
        "added": sorted(a_ids - b_ids),
        "changed": sorted(rows_a[i][0] for i in range(120) if i % 9 == 4 and i % 31 != 6),
        "removed": sorted(b_ids - a_ids),
    }
    _, still_a = nights.run(rows_a)
    assert still_a["run_key"] == again_a["run_key"], "now the latest: nothing to do"

    nights.args(rows_b)  # night b's rows, sent again gzipped
    packed = tmp_path / "in.csv.gz"
    packed.write_bytes(gzip.compress((tmp_path / "in.csv").read_bytes()))
    fake_openai.reset()
    args = ["run", packed.name, *nights.args(rows_b)[2:]]
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    uri = next(ln.split()[-1] for ln in result.stdout.splitlines() if ln.startswith("manifest"))
    again_b = json.loads(Path(uri).read_text())
    assert fake_openai.counters()["inputs"] == 0
    assert (again_b["generation"], again_b["supersedes"]) == (1, night_b["run_key"])
    nights.check(again_b, rows_b)
    nights.load(again_b, rows_b)
    assert sorted(read_embeddings(str(nights.out))["id"]) == sorted(b_ids)
    # the night after a generation is a delta of it: a cut-short export is refused before
    # anything is sent, its dry run too
    fake_openai.reset()
    short = [(r[0], r[1] + " (cut)", r[2]) for r in rows_b[:20]]
    for extra in (["--dry-run"], []):
        result = run_cli(*nights.args(short), *extra, cwd=tmp_path)
        assert result.returncode == 2 and "would delete" in result.stdout + result.stderr
    assert fake_openai.counters()["inputs"] == 0
    charged, night_c = nights.run(rows_b[:-1])
    assert charged == 0 and any(e.get("drop_ids") for e in night_c["chunks"])
    nights.check(night_c, rows_b[:-1])


def test_a_cut_short_export_is_refused_before_anything_is_sent_dry_run_or_not(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """A delta night removing more than --max-delete-fraction of the last run's rows was
    refused only at its commit, after its new texts were paid for, and its dry run said
    nothing of the removals. The lookup knows them: both refuse there, nothing sent."""
    nights = Nights(tmp_path, fake_openai)
    rows = _first(100)
    nights.run(rows)
    short = [(r[0], r[1] + " (edited)", r[2]) if i < 10 else r for i, r in enumerate(rows[:30])]
    before = _chunk_files(nights.out)
    for extra in (["--dry-run"], []):
        fake_openai.reset()
        result = run_cli(*nights.args(short), *extra, cwd=tmp_path)
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        said = result.stdout + result.stderr
        assert "would delete 70 of 100 rows (70%)" in said and "--max-delete-fraction" in said
        assert "Traceback" not in said
        assert fake_openai.counters()["inputs"] == 0, "refused before any request"
        assert _chunk_files(nights.out) == before, "nothing written"
    result = run_cli(*nights.args(short), "--dry-run", "--max-delete-fraction", "0.7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "10 new texts" in result.stdout
    charged, second = nights.run(short, "--max-delete-fraction", "0.7")  # a compaction
    assert charged == 10
    nights.check(second, short)
    one_less = [(r[0], r[1] + " again", r[2]) if i == 3 else r for i, r in enumerate(short[1:])]
    result = run_cli(*nights.args(one_less), "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    said = f"0 added, 1 changed, 1 removed against run {second['run_key'][:12]} (a delta night)"
    assert said in result.stdout


def _chunk_files(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "chunks").iterdir()}


def _kill_at_random(nights: Nights, args: list[str], rng: random.Random, kills: int) -> None:
    """Start ``args`` and kill -9 it at a random moment, ``kills`` times; no chunk object
    is ever rewritten."""
    seen = _chunk_files(nights.out)
    for _ in range(kills):
        proc = popen_cli(
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
