"""``--batch-api`` under a seeded model-based test: random faults of the fake Batch API
(``tests/support/fake_batch.py``) and of the process, then the invariants that must hold
whatever the sequence.

A seed (``random.Random(seed)``) draws a CSV (texts repeated across ids, texts the fake
refuses with a 400, texts that meet a 500 once or twice in a batch), batching options, and
the faults: a create that fails after creating, batches that expire after their first
requests (on some runs only), result file ids that come late, an enqueued-token limit
(sometimes below one input: no wait can end it), the process killed at random points of the
stage (before or after the provider acted on a call: ``Killed``, raised from the Batch API
client like ``kill -9``), and the ledger lost between runs. Each run is the flow in-process,
on the session's Prefect server; the sequence reruns until the run ends:

- complete (exit 0);
- or with one line naming the command that finishes it, which the next run follows:
  ``--batch-fallback sync`` (what batches could not answer, sent synchronously) or
  ``--allow-failed-rows`` (dead letters: the texts the fake refuses); any other end is rerun
  as it is; at most ``MAX_RUNS`` runs in all.

Invariants after every sequence, judged by the fake, never by embedline's counts:

- each text is billed at most once across batches and synchronous requests
  (``batch_charged`` + ``charged``, per text);
- the sequence ended as above;
- the committed output (read as a plain reader does) holds every row but those the fake
  refuses, each with the fake's deterministic vector of its text; so does every chunk object
  written.

CI runs ``CI_SEEDS``; ``-m slow`` runs ``EMBEDLINE_BATCH_MODEL_SEEDS`` (a count from seed 1000,
or comma-separated seeds to replay one). A failure names the seed and every run's steps.
"""

from __future__ import annotations

import io
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.bounded import within, write_csv
from tests.support.fake_batch import FakeBatchServer
from tests.support.fake_openai import expected_vector
from tests.support.output import read_local_output

pytestmark = pytest.mark.integration

DIMS = 8
# between them: a kill after a create then a lost ledger (161), a token limit below one input
# with expiring batches (12), a kill after a poll with a 500 and a 400 (192)
CI_SEEDS = (12, 161, 192)
MAX_RUNS = 8
RUN_TIMEOUT_S = 60  # a run that has not ended by then never would: the test fails
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")


class Killed(BaseException):
    """The process dying at a Batch API call (before or after the provider acted on it)."""


@pytest.fixture(scope="module")
def running_batch_server() -> Iterator[FakeBatchServer]:
    with FakeBatchServer(dims=DIMS, complete_after_s=0.02) as server:
        yield server


@pytest.fixture
def server(running_batch_server: FakeBatchServer) -> Iterator[FakeBatchServer]:
    running_batch_server.reset_batches()
    yield running_batch_server
    running_batch_server.reset_batches()


@dataclass
class Sequence:
    """One seed's draw: the input, the options, the faults; and what happened (``steps``)."""

    seed: int
    texts: list[str]
    options: dict[str, Any]
    faults: dict[str, Any]
    expire_runs: set[int]
    kills: dict[int, tuple[str, int, bool]]  # run → (call, nth call, after it acted)
    lose_ledger: set[int]
    steps: list[str] = field(default_factory=list)


def draw(seed: int) -> Sequence:
    rng = random.Random(seed)
    n = rng.randint(5, 14)
    texts: list[str] = []
    for i in range(n):
        if texts and rng.random() < 0.2:
            texts.append(rng.choice(texts))  # the same text under another id
            continue
        words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 4))]
        marker = rng.choices(["", "REJ", "FLAKY"], weights=(14, 1, 3))[0]
        texts.append(" ".join([*words, f"t{i}", marker]).strip())
    options = {
        "chunk_size": rng.choice((3, 4, 6)),
        "batch_size": rng.choice((1, 2, 3)),
        "batch_max_inputs": rng.choice((2, 4, 50_000)),
    }
    most = max(max(1, len(t.split())) for t in texts)
    limit = rng.choice((None, None, most, most + 4, max(1, most - 1)))
    faults = {
        "create_fails_after_creating": rng.choice((0, 0, 1, 2)),
        "output_id_race": rng.choice((0, 0, 1, 3)),
        "enqueued_token_limit": limit,
        "batch_texts_fail": {"FLAKY": 500},
        "batch_texts_fail_times": rng.choice((1, 2)),
        "reject_texts_containing": "REJ",
    }
    runs = range(MAX_RUNS)
    calls = ("upload", "create_batch", "get_batch")
    return Sequence(
        seed=seed,
        texts=texts,
        options=options,
        faults=faults,
        expire_runs={r for r in runs if rng.random() < 0.3},
        kills={
            r: (rng.choice(calls), rng.randint(1, 4), rng.random() < 0.5)
            for r in range(3)
            if rng.random() < 0.4
        },
        lose_ledger={r for r in range(1, MAX_RUNS) if rng.random() < 0.3},
    )


@dataclass
class Killer:
    """Raises ``Killed`` at the ``nth`` call of ``call`` (after the provider acted on it
    when ``after``), once."""

    call: str
    nth: int
    after: bool
    seen: int = 0
    fired: bool = False

    def wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(client: Any, *args: Any, **kwargs: Any) -> Any:
            if name != self.call or self.fired:
                return real(client, *args, **kwargs)
            self.seen += 1
            if self.seen < self.nth:
                return real(client, *args, **kwargs)
            self.fired = True
            if self.after:
                real(client, *args, **kwargs)
            raise Killed(f"killed at {name} #{self.nth} ({'after' if self.after else 'before'})")

        return call


def run_once(
    tmp_path: Path, server: FakeBatchServer, api_url: str, options: dict[str, Any]
) -> dict[str, Any]:
    from embedline.parameters import grouped
    from flows.embed_csv import embed_csv

    parameters: dict[str, Any] = dict(
        input=str(tmp_path / "in.csv"),
        output=str(tmp_path / "out"),
        ledger=str(tmp_path / "ledger.sqlite3"),
        embedder="openai",
        base_url=server.base_url,
        chunk_retries=0,
        batch_api=True,
        batch_poll_interval=0.02,
        max_attempts=2,
        **options,
    )
    with within(RUN_TIMEOUT_S), temporary_settings(updates={PREFECT_API_URL: api_url}):
        state = embed_csv(**grouped(parameters), return_state=True)
    summary = state.result(raise_on_failure=False)
    summary = getattr(summary, "summary", summary)
    assert isinstance(summary, dict), f"the run raised {summary!r}"
    return summary


def published(out: Path) -> dict[str, list[np.ndarray]]:
    """Every row's vectors in every chunk object under ``out`` (a manifest or not)."""
    found: dict[str, list[np.ndarray]] = {}
    for path in sorted((out / "chunks").glob("*.parquet")) if (out / "chunks").exists() else []:
        table = pq.read_table(io.BytesIO(path.read_bytes()))
        for row_id, vector in zip(
            table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True
        ):
            found.setdefault(row_id, []).append(np.asarray(vector, dtype=np.float32))
    return found


def run_sequence(
    tmp_path: Path,
    seed: int,
    server: FakeBatchServer,
    api_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> int:
    """Run seed ``seed``'s sequence to its end and check the invariants; return its runs."""
    from adapters.embeddings.openai_batch import BatchClient

    seq = draw(seed)
    tmp_path.mkdir(parents=True, exist_ok=True)
    rows = write_csv(tmp_path / "in.csv", seq.texts)
    server.reset_batches()
    for name, value in seq.faults.items():
        setattr(server, name, value)
    seq.steps.append(f"seed {seed}: {len(rows)} rows, {seq.options}, faults {seq.faults}")
    options = dict(seq.options)
    ended: dict[str, Any] | None = None
    runs = 0
    for run in range(MAX_RUNS):
        runs += 1
        if run in seq.lose_ledger:
            for suffix in ("", "-wal", "-shm"):
                (tmp_path / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
        server.expire_after = 1 if run in seq.expire_runs else None
        killer = Killer(*seq.kills[run]) if run in seq.kills else None
        with monkeypatch.context() as patch:
            if killer is not None:
                for name in ("upload", "create_batch", "get_batch"):
                    patch.setattr(BatchClient, name, killer.wrap(name, getattr(BatchClient, name)))
            try:
                summary = run_once(tmp_path, server, api_url, options)
            except Killed as exc:
                seq.steps.append(f"run {run}: {exc}")
                continue
        step = (
            f"run {run}: exit {summary['exit_code']} {summary['status']}"
            f"{' (ledger lost)' if run in seq.lose_ledger else ''}"
            f"{' (expiring)' if run in seq.expire_runs else ''}"
            f"{' (the kill never came)' if killer is not None and not killer.fired else ''}"
            f": {summary['message']}"
        )
        seq.steps.append(step)
        if summary["exit_code"] == 0:
            ended = summary
            break
        if "--batch-fallback sync" in summary["message"]:  # follow the line
            options["batch_fallback"] = "sync"
        if "--allow-failed-rows" in summary["message"]:  # dead letters: the texts it refuses
            options["allow_failed_rows"] = True
    where = "\n".join(seq.steps)
    # billed at most once, batches and synchronous requests together
    total = server.batch_charged + server.charged
    assert all(n == 1 for n in total.values()), f"a text billed twice\n{where}"
    assert ended is not None, f"the sequence did not end in {MAX_RUNS} runs\n{where}"
    refused = {i for i, t in rows if "REJ" in t}
    _, committed = read_local_output(tmp_path / "out")  # as a plain reader reads it
    assert set(committed) == {i for i, _ in rows} - refused, where
    objects = published(tmp_path / "out")  # every chunk object written, superseded or not
    for row_id, text in rows:
        for vector in objects.get(row_id, []):
            np.testing.assert_allclose(
                vector, expected_vector(text, DIMS), rtol=1e-6, err_msg=f"{row_id}\n{where}"
            )
        if row_id in committed:
            np.testing.assert_allclose(
                committed[row_id], expected_vector(text, DIMS), rtol=1e-6, err_msg=where
            )
    print(where)  # shown with -rP
    return runs


def _report(record: Any, seeds: list[int], runs: int) -> None:
    """Record how many sequences and runs were tried (shown in the JUnit report)."""
    record(
        "summary",
        f"batch model: {len(seeds)} sequences (seed{'s' * (len(seeds) > 1)} "
        f"{', '.join(map(str, seeds))}), {runs} runs, every invariant held",
    )


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_random_batch_faults_bill_each_text_once_and_always_end(
    tmp_path: Path,
    seed: int,
    server: FakeBatchServer,
    prefect_api_url: str,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    runs = run_sequence(tmp_path, seed, server, prefect_api_url, monkeypatch)
    _report(record_property, [seed], runs)


def _soak_seeds() -> list[int]:
    spec = os.environ.get("EMBEDLINE_BATCH_MODEL_SEEDS", "50")
    if "," in spec or not spec.isdigit():
        return [int(s) for s in spec.split(",") if s.strip()]
    return list(range(1000, 1000 + int(spec)))


@pytest.mark.slow
def test_random_batch_faults_soak(
    tmp_path: Path,
    server: FakeBatchServer,
    prefect_api_url: str,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    """Many more seeds: ``EMBEDLINE_BATCH_MODEL_SEEDS=N`` runs seeds 1000 to 1000 + N - 1,
    ``EMBEDLINE_BATCH_MODEL_SEEDS=17,`` replays seed 17 alone."""
    seeds, total = _soak_seeds(), 0
    for seed in seeds:
        total += run_sequence(tmp_path / f"seed-{seed}", seed, server, prefect_api_url, monkeypatch)
    _report(record_property, seeds, total)
