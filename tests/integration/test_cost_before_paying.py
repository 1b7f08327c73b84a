"""Cost before you pay: ``run --dry-run`` prints the estimate without a request or a write,
and counts only what a night would send; once earlier nights' reported usage calibrates the
estimate, it comes within 5 % of what the server then charges; ``run --max-cost`` stops
before a request would pass the cap (exit 3, nothing lost) and a rerun with a higher cap
completes. Tokens spent are computed from the fake server's own ``usage`` rule (one token per
word), never from embedline's output."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.embeddings import approximate_tokens
from embedline.calibration import FIRST_RUN_METHOD
from tests.support.fake_openai import FakeEmbeddingServer, expected_matrix
from tests.support.fixtures import run_cli
from tests.support.output import vectors_by_id
from tests.support.real_data import ENGLISH_NAME, real_csv

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

ESTIMATE = re.compile(r"^estimate   ([\d,]+) tokens for ([\d,]+) new texts, ", re.M)
CALIBRATED = re.compile(
    r"^tokens     calibrated by ([\d,]+) tokens reported by this endpoint for (\S+) ", re.M
)
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
]


def _rows(n: int, *, edited: int = 0) -> list[tuple[str, str]]:
    """``n`` rows of 4-19 words, a repeated text every 25th row; the first ``edited`` rows'
    texts changed."""
    rows = []
    for i in range(n):
        text = f"w{i} " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 16))
        if i % 25 == 5:
            text = "the same text in several rows"
        if i < edited:
            text = f"edited {i} " + text
        rows.append((f"id{i:04d}", text))
    return rows


def _fake_tokens(text: str) -> int:
    """The fake server's ``usage`` for one text (tests/support/fake_openai.py)."""
    return max(1, len(text.split()))


class Nights:
    """One output, one ledger; ``args(rows)`` writes the CSV and the command line."""

    def __init__(self, tmp: Path, server: FakeEmbeddingServer) -> None:
        self.tmp, self.server, self.out = tmp, server, tmp / "out"

    def args(self, rows: list[tuple[str, str]], *extra: str) -> list[str]:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(("id", "text"))
        writer.writerows(rows)
        (self.tmp / "in.csv").write_text(buf.getvalue(), encoding="utf-8")
        return [
            "run", "in.csv", "--embedder", "openai", "--base-url", self.server.base_url,
            "--output", str(self.out), "--ledger", "ledger.sqlite3", "--chunk-size", "30",
            "--batch-size", "10", *extra,
        ]  # fmt: skip

    def run(self, rows: list[tuple[str, str]], *extra: str) -> Any:
        return run_cli(*self.args(rows, *extra), cwd=self.tmp)

    def spent_tokens(self, rows: list[tuple[str, str]]) -> int:
        """Tokens the server billed since its last reset (texts charged × their usage)."""
        by_hash = {hashlib.sha256(t.encode()).hexdigest(): t for _, t in rows}
        return sum(_fake_tokens(by_hash[h]) * n for h, n in self.server.charged_texts().items())

    def state(self) -> tuple[list[tuple[str, int]], list[tuple[Any, ...]]]:
        """Every file of the output (path, size) and every row of the ledger's runs table."""
        files = sorted(
            (str(p.relative_to(self.out)), p.stat().st_size)
            for p in self.out.rglob("*")
            if p.is_file()
        )
        ledger = self.tmp / "ledger.sqlite3"
        if not ledger.exists():
            return files, []
        with sqlite3.connect(ledger) as db:
            runs = db.execute("SELECT * FROM runs ORDER BY run_key").fetchall()
        return files, runs


def _estimate(stdout: str) -> tuple[int, int]:
    found = ESTIMATE.search(stdout)
    assert found, stdout
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))


def test_dry_run_sends_nothing_writes_nothing_and_counts_only_a_nights_new_texts(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    nights = Nights(tmp_path, fake_openai)
    first = _rows(120)
    result = nights.run(first, "--dry-run", "--price-per-million-tokens", "0.02")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[0].startswith("estimate   ")
    tokens, texts = _estimate(result.stdout)
    assert texts == len({t for _, t in first})  # distinct texts: duplicates sent once
    assert "with the Batch API" in result.stdout
    assert fake_openai.counters()["requests"] == 0
    assert not nights.out.exists()  # the output is not even created
    assert nights.state()[1] == []  # no run recorded

    assert f"tokens     {FIRST_RUN_METHOD}" in result.stdout
    assert tokens == sum(approximate_tokens(t) for t in {t for _, t in first})

    result = nights.run(first)
    assert result.returncode == 0, result.stderr[-3000:]

    # a second night, 7 texts edited and 3 rows added: only those are new
    second = _rows(123, edited=7)
    before = nights.state()
    fake_openai.reset()
    result = nights.run(second, "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    tokens, texts = _estimate(result.stdout)
    new = [t for _, t in second[:7]] + [t for _, t in second[120:]]
    assert texts == len(set(new))
    # the first night reported too few tokens to calibrate: the estimate by script stands
    assert tokens == sum(approximate_tokens(t) for t in set(new))
    assert f"tokens     {FIRST_RUN_METHOD}" in result.stdout
    assert "no price given" in result.stdout
    assert fake_openai.counters()["requests"] == 0
    assert nights.state() == before  # output files and the ledger's runs unchanged


def _debian_rows(n: int) -> list[tuple[str, str]]:
    """The first ``n`` rows of the English Debian file with a non-empty text."""
    csv.field_size_limit(1 << 24)
    rows = []
    with open(real_csv(ENGLISH_NAME), encoding="utf-8-sig", newline="") as fh:
        for record in csv.DictReader(fh):
            if record["text"].strip():
                rows.append((record["id"], record["text"]))
            if len(rows) == n:
                return rows
    raise AssertionError(f"fewer than {n} rows")


def test_a_dry_run_calibrated_by_earlier_nights_is_within_5_percent_of_the_charge(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    nights = Nights(tmp_path, fake_openai)
    first = _debian_rows(400)[:300]
    result = nights.run(first, "--chunk-size", "100", "--batch-size", "50")
    assert result.returncode == 0, result.stderr[-3000:]
    paid = nights.spent_tokens(first)
    assert paid > 10_000  # enough to calibrate (embedline.calibration.MIN_CALIBRATION_TOKENS)

    # an edited night: 40 texts changed, 100 rows added, 20 rows gone
    more = _debian_rows(400)
    second = [(i, f"{t} (revised)" if n % 7 == 0 else t) for n, (i, t) in enumerate(more[20:])]
    fake_openai.reset()
    result = nights.run(second, "--chunk-size", "100", "--batch-size", "50", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    estimated, texts = _estimate(result.stdout)
    found = CALIBRATED.search(result.stdout)
    assert found, result.stdout
    assert int(found[1].replace(",", "")) == paid  # what the first night was charged
    assert fake_openai.counters()["requests"] == 0

    result = nights.run(second, "--chunk-size", "100", "--batch-size", "50")
    assert result.returncode == 0, result.stderr[-3000:]
    charged = nights.spent_tokens(second)
    assert texts == sum(fake_openai.charged_texts().values())
    assert abs(estimated - charged) <= 0.05 * charged, (estimated, charged)


def test_max_cost_stops_before_the_cap_and_a_rerun_with_a_higher_cap_completes(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    nights = Nights(tmp_path, fake_openai)
    rows = _rows(150)
    refused = nights.run(rows, "--max-cost", "1")
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "--price-per-million-tokens" in refused.stderr

    # one USD per token: the cap is 400 tokens, about a quarter of the file's
    cap = 400
    price = ("--price-per-million-tokens", "1000000")
    result = nights.run(rows, "--max-cost", str(cap), *price)
    assert result.returncode == 3, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "--max-cost $400.00 reached" in last and "rerun with a higher --max-cost" in last
    spent = nights.spent_tokens(rows)
    one_request = 10 * max(_fake_tokens(t) for _, t in rows)  # --batch-size 10
    assert 0 < spent <= cap + one_request
    assert spent <= cap  # the estimate over-counts these texts: not even one request over

    # nothing lost: what was paid for (published chunks, kept requests) is not paid again
    result = nights.run(rows, "--max-cost", "100000", *price)
    assert result.returncode == 0, result.stderr[-3000:]
    charged = fake_openai.charged_texts()
    assert set(charged.values()) == {1}
    assert nights.spent_tokens(rows) == sum(_fake_tokens(t) for t in {t for _, t in rows})
    uri = next(
        line.split()[-1] for line in result.stdout.splitlines() if line.startswith("manifest")
    )
    manifest = json.loads(Path(uri).read_text())
    bodies = {e["object"]: (nights.out / e["object"]).read_bytes() for e in manifest["chunks"]}
    vectors = vectors_by_id(bodies, manifest)
    assert sorted(vectors) == [i for i, _ in rows]
    got = np.stack([vectors[i] for i, _ in rows])
    assert np.allclose(got, expected_matrix([t for _, t in rows]), rtol=1e-6, atol=1e-7)


def test_the_flow_parameter_dry_run_returns_the_estimate_as_data_and_an_artifact(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from embedline.parameters import grouped
    from flows.embed_csv import embed_csv

    rows = _rows(40)
    Nights(tmp_path, fake_openai).args(rows)  # writes in.csv
    with temporary_settings(updates={PREFECT_API_URL: prefect_api_url}):
        parameters = dict(
            input=str(tmp_path / "in.csv"),
            output=str(tmp_path / "out"),
            ledger=str(tmp_path / "ledger.sqlite3"),
            embedder="openai",
            base_url=fake_openai.base_url,
            price_per_million_tokens=0.02,
            dry_run=True,
        )
        state = embed_csv(**grouped(parameters), return_state=True)
        assert state.is_completed()
        estimate = state.result()
        with get_client(sync_client=True) as client:
            runs = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
            artifacts = {a.key: a for a in client.read_artifacts(flow_run_filter=runs) if a.key}
    assert estimate["new_texts"] == len({t for _, t in rows})
    assert estimate["cost"] == pytest.approx(estimate["tokens"] * 0.02 / 1e6)
    assert "| estimate |" in str(artifacts["embedline-estimate"].data)
    assert "~" not in str(artifacts["embedline-estimate"].data)  # no strikethrough
    assert fake_openai.counters()["requests"] == 0
    assert not (tmp_path / "out").exists()
