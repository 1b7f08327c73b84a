"""Pay once per row: nightly edits of a real Debian sample cost only the rows that changed.

Each scenario edits the CSV the way a nightly re-export does, reruns ``embedline run`` on
the same output, and counts the inputs the fake OpenAI-compatible server was sent; then it
checks every id's vector against the server's deterministic vector for its text (not
against embedline's earlier output) and the change set against the edit.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_matrix
from tests.support.fixtures import run_cli
from tests.support.moto_server import make_s3_client, moto_env
from tests.support.output import vectors_by_id
from tests.support.real_data import ENGLISH_NAME, real_csv

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

DATA = real_csv(ENGLISH_NAME)  # vendored in tests/data
Rows = list[tuple[str, str]]


def _sample(n: int | None) -> Rows:
    """The first ``n`` rows (all when None), reading no further than them."""
    with DATA.open(encoding="utf-8", newline="") as fh:
        return [(r["id"], r["text"]) for r in itertools.islice(csv.DictReader(fh), n)]


def _write(path: Path, rows: Rows, *, newline: str = "\n") -> Path:
    """Write the CSV with ``newline`` ending each record (line breaks inside quoted texts
    stay as they are, as spreadsheet exports do)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator=newline)
    writer.writerow(("id", "text"))
    writer.writerows(rows)
    path.write_bytes(buf.getvalue().encode())
    return path


def _distinct_texts(rows: Rows) -> int:
    return len({t for _, t in rows if t.strip()})


class Nightly:
    """One output root and ledger; ``run(rows)`` rewrites the CSV and runs the CLI."""

    def __init__(
        self,
        tmp: Path,
        server: FakeEmbeddingServer,
        output: str,
        env: dict[str, str] | None = None,
        chunk_size: int = 1000,
    ) -> None:
        self.tmp, self.server, self.output, self.env = tmp, server, output, env
        self.chunk_size = chunk_size
        self.ledger = tmp / "ledger.sqlite3"

    def run(self, rows: Rows, *extra: str, newline: str = "\n") -> tuple[int, dict[str, Any]]:
        """Return (inputs the server was sent, the committed manifest)."""
        self.server.reset()
        _write(self.tmp / "in.csv", rows, newline=newline)
        result = run_cli(
            "run",
            str(self.tmp / "in.csv"),
            "--embedder",
            "openai",
            "--base-url",
            self.server.base_url,
            "--output",
            self.output,
            "--ledger",
            str(self.ledger),
            "--chunk-size",
            str(self.chunk_size),
            "--batch-size",
            "256",
            *extra,
            cwd=self.tmp,
            env=self.env,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        uri = next(
            line.split()[-1] for line in result.stdout.splitlines() if line.startswith("manifest")
        )
        return self.server.counters()["inputs"], json.loads(self._read(uri))

    def _read(self, uri: str) -> bytes:
        if uri.startswith("s3://"):
            bucket, key = uri[5:].split("/", 1)
            client = make_s3_client(self.env["AWS_ENDPOINT_URL"]) if self.env else None
            return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        return Path(uri).read_bytes()

    def object(self, key: str) -> bytes:
        if self.output.startswith("s3://"):
            return self._read(f"{self.output}/{key}")
        return (Path(self.output) / key).read_bytes()

    def check(self, manifest: dict[str, Any], rows: Rows) -> None:
        """Every id of ``rows`` with a non-empty text has the server's vector for its text."""
        bodies = {e["object"]: self.object(e["object"]) for e in manifest["chunks"]}
        vectors = vectors_by_id(bodies, manifest)
        live = [(i, t) for i, t in rows if t.strip()]
        assert sorted(vectors) == sorted(i for i, _ in live)
        expected = expected_matrix([t for _, t in live])
        got = np.stack([vectors[i] for i, _ in live])
        wrong = [
            live[k][0]
            for k in np.flatnonzero(~np.isclose(got, expected, rtol=1e-6, atol=1e-7).all(axis=1))
        ]
        assert not wrong, f"{len(wrong)} ids have another text's vector, e.g. {wrong[:5]}"

    def changes(self, manifest: dict[str, Any]) -> dict[str, list[str]]:
        table = pq.read_table(io.BytesIO(self.object(manifest["changes"]["object"])))
        out: dict[str, list[str]] = {"added": [], "changed": [], "removed": []}
        for row in table.to_pylist():
            out[row["change"]].append(row["id"])
        return out


def _edits(rows: Rows) -> list[tuple[str, Rows, int]]:
    """(name, edited rows, inputs that may be charged) for the issue's table."""
    middle = len(rows) // 2
    edited = list(rows)
    edited[middle] = (edited[middle][0], edited[middle][1] + " (edited)")
    return [
        ("insert after header", [("new-first", "a brand new package, first row"), *rows], 1),
        ("edit in the middle", edited, 1),
        ("append at the end", [*edited, ("new-last", "a brand new package, last row")], 1),
    ]


def _scenarios(nightly: Nightly, rows: Rows) -> list[tuple[str, int, int]]:
    """Run the first night and every edit; return (name, charged, allowed) per night."""
    results = []
    charged, manifest = nightly.run(rows)
    assert charged == _distinct_texts(rows), "one run: inputs charged = distinct texts"
    nightly.check(manifest, rows)
    results.append(("first run", charged, _distinct_texts(rows)))
    current = rows
    for name, edited, allowed in _edits(rows):
        charged, manifest = nightly.run(edited)
        nightly.check(manifest, edited)
        results.append((name, charged, allowed))
        current = edited
    shuffled = list(current)
    random.Random(7).shuffle(shuffled)
    charged, manifest = nightly.run(shuffled)
    nightly.check(manifest, shuffled)
    assert nightly.changes(manifest) == {"added": [], "changed": [], "removed": []}
    results.append(("rows shuffled", charged, 0))
    kept = [r for i, r in enumerate(shuffled) if i % 10 != 3]
    gone = sorted(r[0] for i, r in enumerate(shuffled) if i % 10 == 3 and r[1].strip())
    charged, manifest = nightly.run(kept)
    nightly.check(manifest, kept)
    assert nightly.changes(manifest) == {"added": [], "changed": [], "removed": gone}
    results.append(("10 % of rows deleted", charged, 0))
    charged, manifest = nightly.run(kept, newline="\r\n")
    nightly.check(manifest, kept)
    results.append(("re-export with CRLF", charged, 0))
    return results


def _report(results: Sequence[tuple[str, int, int]]) -> None:
    for name, charged, allowed in results:
        assert charged == allowed, f"{name}: {charged} inputs charged, expected {allowed}"


# 200 rows in 10 chunks: the same chunk boundaries shifted by each edit as 2,000 rows gave
# (44 s -> see the commit); 10,000 rows: test_nightly_edits_on_a_10000_row_sample (slow)
@pytest.mark.parametrize("n", [200])
def test_nightly_edits_charge_only_changed_rows(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, n: int
) -> None:
    rows = _sample(n)
    nightly = Nightly(tmp_path, fake_openai, str(tmp_path / "out"), chunk_size=n // 10)
    _report(_scenarios(nightly, rows))


def test_fresh_ledger_against_s3_reuses_what_the_store_holds(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    rows = _sample(150)  # 10 chunks, as 1,500 rows in chunks of 150 were
    env = moto_env(moto_endpoint)
    first = Nightly(tmp_path, fake_openai, f"s3://{s3_bucket}/emb", env, chunk_size=15)
    charged, manifest = first.run(rows)
    assert charged == _distinct_texts(rows)
    (tmp_path / "ledger.sqlite3").unlink()  # a new machine: nothing but the bucket
    shifted = [("new-first", "a brand new package, first row"), *rows]
    charged, manifest = first.run(shifted)
    assert charged == 1
    first.check(manifest, shifted)
    assert first.changes(manifest) == {"added": ["new-first"], "changed": [], "removed": []}
    # the second night was a delta: one chunk object, of its one new row
    assert manifest["chunks"][0]["rows"] == 1 and "drop_ids" not in manifest["chunks"][0]
    # --no-reuse: rows of chunks not already published are all sent again (new chunk
    # keys after a reversal), even though the bucket holds their vectors; the reversal's
    # last chunk holds "new-first" alone, the very chunk the delta night published: a
    # published chunk is skipped (resume, not reuse)
    reversed_rows = shifted[::-1]
    charged, manifest = first.run(reversed_rows, "--no-reuse")
    assert charged == _distinct_texts(shifted) - 1
    first.check(manifest, reversed_rows)


@pytest.mark.slow
def test_nightly_edits_on_a_10000_row_sample(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = _sample(10_000)
    nightly = Nightly(tmp_path, fake_openai, str(tmp_path / "out"), chunk_size=1000)
    results = _scenarios(nightly, rows)
    print(
        "\n".join(
            f"{name}: {charged} charged (right number {allowed})"
            for name, charged, allowed in results
        )
    )
    _report(results)


@pytest.mark.slow
def test_one_run_over_the_whole_file_charges_each_distinct_text_once(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = _sample(None)
    nightly = Nightly(tmp_path, fake_openai, str(tmp_path / "out"), chunk_size=1000)
    charged, manifest = nightly.run(rows, "--allow-failed-rows")  # one empty text
    assert manifest["rows_failed"] == sum(1 for _, t in rows if not t.strip())
    assert charged == _distinct_texts(rows)
    nightly.check(manifest, rows)
