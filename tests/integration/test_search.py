"""Search over the local model's vectors of the real Debian sample (250 packages): a package's
own short description (its ``title`` column; the vectors are of its long ``text``) finds that
package first, over the published vectors and over the LanceDB and Qdrant (local mode) sinks;
and ``embedline search`` prints ranked ids."""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.search import search_target
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

SAMPLE = REPO / "examples" / "debian-sample.csv"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """What ``make demo`` does: the sample, local model, loaded into LanceDB."""
    cwd = tmp_path_factory.mktemp("demo")
    result = run_cli(
        "run",
        str(SAMPLE),
        "--chunk-size",
        "50",
        "--output",
        "embedline-output",
        "--sink",
        "lancedb://./embedline-output/lancedb",
        "--ledger",
        str(cwd / "ledger.sqlite3"),
        cwd=cwd,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^rows +250 upserted now", result.stdout, re.M), result.stdout
    loaded = run_cli(
        "load",
        "--to",
        "qdrant+local://./embedline-output/qdrant",
        "--output",
        "embedline-output",
        "--ledger",
        str(cwd / "ledger.sqlite3"),
        cwd=cwd,
        timeout=600,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert re.search(r"^rows +250 upserted now", loaded.stdout, re.M), loaded.stdout
    yield cwd


def _titles(n: int, seed: int = 0) -> list[tuple[str, str]]:
    with open(SAMPLE, newline="", encoding="utf-8") as fh:
        records = [(r["id"], r["title"]) for r in csv.DictReader(fh)]
    return random.Random(seed).sample(records, n)


@pytest.mark.parametrize("where", ["published vectors", "lancedb sink", "qdrant sink"])
def test_a_packages_short_description_finds_it_first_for_9_of_10(demo: Path, where: str) -> None:
    sampled = _titles(10)
    target = {
        "published vectors": str(demo / "embedline-output"),
        "lancedb sink": f"lancedb://{demo}/embedline-output/lancedb",
        "qdrant sink": f"qdrant+local://{demo}/embedline-output/qdrant",
    }[where]
    hits = search_target(
        target, [title for _, title in sampled], k=3, ledger=str(demo / "ledger.sqlite3")
    )
    first = [h[0][0] for h in hits]
    found = sum(package == top for (package, _), top in zip(sampled, first, strict=True))
    assert found >= 9, list(zip([p for p, _ in sampled], first, strict=True))


@pytest.mark.parametrize(
    "sink", ["lancedb://./embedline-output/lancedb", "qdrant+local://./embedline-output/qdrant"]
)
def test_embedline_search_prints_ranked_ids(demo: Path, sink: str) -> None:
    result = run_cli(
        "search", sink, "Real-time strategy game of ancient warfare", "--k", "5", cwd=demo
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["rank", "score", "id"]
    ranked = [line.split() for line in lines[1:]]
    assert [r[0] for r in ranked] == ["1", "2", "3", "4", "5"]
    assert ranked[0][2] == "0ad"
    scores = [float(r[1]) for r in ranked]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_search_on_a_sink_embeds_the_query_at_the_loaded_runs_base_url(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """A sink loaded from an OpenAI-compatible server at --base-url: search without
    --base-url went to OpenAI's API (5 retries, exit 3); it now takes the ledger's record
    of the run last loaded into that sink. The fake server's deterministic vector of a
    row's own text is that row's vector, so it ranks first."""
    rows = [(f"pkg{i}", f"package number {i} does a thing of kind {i % 7}") for i in range(30)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows))
    sink = f"lancedb://{tmp_path}/lance"
    result = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--sink",
        sink,
        "--ledger",
        "ledger.sqlite3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before = fake_openai.requests
    found = run_cli(
        "search", sink, rows[12][1], "--k", "1", "--ledger", "ledger.sqlite3", cwd=tmp_path
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip().splitlines()[1].split()[2] == "pkg12"
    assert fake_openai.requests == before + 1
    # without the run's ledger (and no key), say what to pass, at once: before, the query
    # went to OpenAI's API and exited 3 after 11 s of retries. Sink and output root alike.
    keyless = {"EMBEDLINE_API_KEY": "", "OPENAI_API_KEY": ""}
    for target in (sink, "out"):
        lost = run_cli("search", target, rows[12][1], cwd=tmp_path, env=keyless)
        assert lost.returncode == 2, lost.stderr[-2000:]
        assert lost.stderr.splitlines() == [
            "embedline: error: which server embedded these vectors is unknown: the ledger "
            ".embedline/ledger.sqlite3 has no record of their run; pass --ledger (the one the "
            "run used) or --base-url (its server)"
        ], lost.stderr[-2000:]


def test_load_without_run_or_output_takes_the_ledgers_newest_complete_run(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """`load --to SINK --ledger L` looked in ./embedline-output ("no committed run") though
    the ledger recorded a complete run elsewhere; its help says the ledger decides."""
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"p{i},text {i}\n" for i in range(12)))
    done = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "elsewhere",
        "--ledger",
        "ledger.sqlite3",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = run_cli(
        "load", "--to", f"lancedb://{tmp_path}/lance", "--ledger", "ledger.sqlite3", cwd=tmp_path
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert re.search(r"^rows +12 upserted now", loaded.stdout, re.M), loaded.stdout
