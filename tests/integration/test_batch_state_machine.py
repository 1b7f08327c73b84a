"""``--batch-api`` as a state machine that always ends, against the fake Batch API
(``tests/support/fake_batch.py``), judged by the fake's charges (``batch_charged`` and the
synchronous ``charged``, per text) and its deterministic vectors:

- ``custom_id``s are unique within every batch, the split of a refused request and its
  retries included (the fake fails a batch that repeats one, as OpenAI does);
- unanswered requests (expired, cancelled, server errors) are submitted again while the
  completion window allows; after it the run ends with one line naming the command that
  finishes it, and a rerun always submits again;
- a part larger than the enqueued-token limit is split to fit; a refusal no wait can end is
  an error saying what to change;
- the summary counts the texts batches answered as sent, at the batch price.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.bounded import within, write_csv
from tests.support.fake_batch import FakeBatchServer
from tests.support.fake_openai import expected_vector
from tests.support.output import read_local_output

pytestmark = pytest.mark.integration

DIMS = 8


@pytest.fixture(scope="module")
def running_batch_server() -> Iterator[FakeBatchServer]:
    with FakeBatchServer(dims=DIMS, complete_after_s=0.05) as server:
        yield server


@pytest.fixture
def server(running_batch_server: FakeBatchServer) -> Iterator[FakeBatchServer]:
    yield running_batch_server
    running_batch_server.reset_batches()


def run_flow(tmp_path: Path, server: FakeBatchServer, api_url: str, **kw: Any) -> dict[str, Any]:
    from embedline.parameters import grouped
    from flows.embed_csv import embed_csv

    options: dict[str, Any] = dict(
        input=str(tmp_path / "in.csv"),
        output=str(tmp_path / "out"),
        ledger=str(tmp_path / "ledger.sqlite3"),
        embedder="openai",
        base_url=server.base_url,
        chunk_size=4,
        batch_size=2,
        chunk_retries=0,
        batch_api=True,
        batch_poll_interval=0.05,
        price_per_million_tokens=0.02,
    )
    options.update(kw)
    with within(120), temporary_settings(updates={PREFECT_API_URL: api_url}):
        state = embed_csv(**grouped(options), return_state=True)
    summary = state.result(raise_on_failure=False)
    return getattr(summary, "summary", summary)  # type: ignore[no-any-return]


def charged_at_most_once(server: FakeBatchServer) -> None:
    """No text was charged twice, in batches and synchronous requests together."""
    total = server.batch_charged + server.charged
    assert all(n == 1 for n in total.values()), total


def assert_exact(
    tmp_path: Path, rows: list[tuple[str, str]], *, skip: tuple[str, ...] = ()
) -> None:
    _, vectors = read_local_output(tmp_path / "out")
    expected = {i: t for i, t in rows if t.strip() and i not in skip}
    assert set(vectors) == set(expected)
    for row_id, text in expected.items():
        np.testing.assert_allclose(vectors[row_id], expected_vector(text, DIMS), rtol=1e-6)


def failure_codes(server: FakeBatchServer) -> list[str]:
    return [
        b["errors"]["data"][0]["code"] for b in server.batches.values() if b["status"] == "failed"
    ]


# ── custom_ids ──────────────────────────────────────────────────────────────────────────────


def test_the_fake_fails_a_batch_that_repeats_a_custom_id_as_openai_does(
    server: FakeBatchServer,
) -> None:
    from adapters.embeddings.openai_batch import BatchClient

    line = (
        b'{"custom_id":"a","method":"POST","url":"/v1/embeddings",'
        b'"body":{"model":"m","input":["x"]}}\n'
    )
    client = BatchClient(base_url=server.base_url, api_key="k")
    file_id = client.upload("dup.jsonl", line + line)
    batch = client.create_batch(file_id, {"embedline_run": "x"})
    assert batch["status"] == "failed"
    assert batch["errors"]["data"][0]["code"] == "duplicate_custom_id"
    assert batch["errors"]["data"][0]["line"] == 2
    assert server.batch_counters()["batch_inputs"] == 0


def test_a_split_request_meeting_a_5xx_never_repeats_a_custom_id_in_a_batch(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    # one chunk, requests [refused, flaky] and [c, d]: the first is a 500 once, then a 400
    # for its refused input (split into one request per input), then the flaky input's own
    # request is a 500 once: its next batch must carry it once
    write_csv(
        tmp_path / "in.csv",
        ["alpha REJECT one", "beta MARK two", "gamma three", "delta four"],
    )
    server.reject_texts_containing = "REJECT"
    server.batch_texts_fail, server.batch_texts_fail_times = {"MARK": 500}, 1
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert "duplicate_custom_id" not in failure_codes(server)  # before: the run failed whole
    assert (summary["exit_code"], summary["status"]) == (1, "dead_letters"), summary["message"]
    assert summary["rows_failed"] == 1 and summary["rows_published"] == 3
    assert server.batch_counters()["batch_inputs"] == 3 and server.counters()["requests"] == 0
    charged_at_most_once(server)


# ── partial expiry ──────────────────────────────────────────────────────────────────────────


def test_repeated_partial_expiry_is_resubmitted_until_every_request_is_answered(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    texts = [f"text {i} about expiry" for i in range(6)]
    rows = write_csv(tmp_path / "in.csv", texts)
    server.expire_after = 1  # every batch answers its first request, then expires
    summary = run_flow(tmp_path, server, prefect_api_url, chunk_size=6, batch_size=1)
    # before: after 4 resubmissions it stopped for good (exit 1, and every rerun too)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    counters = server.batch_counters()
    assert counters["creates"] == 6 and counters["batch_inputs"] == 6
    assert counters["requests"] == 0
    charged_at_most_once(server)


def test_after_the_completion_window_the_run_names_the_command_that_finishes_it(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks.batch.rounds as rounds

    monkeypatch.setattr(rounds, "COMPLETION_WINDOW_S", 0.0)  # the window ends at once
    texts = [f"text {i} about windows" for i in range(6)]
    rows = write_csv(tmp_path / "in.csv", texts)
    server.expire_after = 1
    first = run_flow(tmp_path, server, prefect_api_url, chunk_size=6, batch_size=1)
    assert first["exit_code"] == 1
    assert "--batch-fallback sync" in first["message"], first["message"]
    assert server.batch_counters()["creates"] == 2  # the batch and one resubmission
    # the summary counts what the batches answered as sent, at the batch price (before:
    # "embedded in-process", "0 tokens at the batch price")
    assert first["batch_inputs"] == first["inputs"] == 2
    assert first["batch_tokens"] == first["tokens"] > 0
    from cli.console import _api_line, cost_lines

    assert "in-process" not in _api_line(first)
    assert "0 tokens at the batch price" not in "\n".join(cost_lines(first))
    # a plain rerun submits again (before: nothing, exit 1 for ever)
    again = run_flow(tmp_path, server, prefect_api_url, chunk_size=6, batch_size=1)
    assert again["exit_code"] == 1 and server.batch_counters()["creates"] == 3
    # following the line finishes it: the rest synchronously, nothing paid twice
    done = run_flow(
        tmp_path, server, prefect_api_url, chunk_size=6, batch_size=1, batch_fallback="sync"
    )
    assert done["exit_code"] == 0, done["message"]
    assert_exact(tmp_path, rows)
    assert server.batch_counters()["batch_inputs"] == 3 and server.counters()["inputs"] == 3
    charged_at_most_once(server)


# ── the enqueued-token limit ────────────────────────────────────────────────────────────────


def test_a_part_larger_than_the_enqueued_token_limit_is_split_to_fit(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    texts = [f"text number {i} about limits" for i in range(4)]  # 5 tokens each (the fake's)
    rows = write_csv(tmp_path / "in.csv", texts)
    server.enqueued_token_limit = 6  # one input at a time: the part, and each request, is over
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 0, summary["message"]
    assert_exact(tmp_path, rows)
    assert set(failure_codes(server)) <= {"token_limit_exceeded"}
    assert server.batch_counters()["batch_inputs"] == 4 and server.counters()["requests"] == 0
    charged_at_most_once(server)


def test_an_input_over_the_enqueued_token_limit_alone_is_an_error_saying_what_to_change(
    tmp_path: Path, server: FakeBatchServer, prefect_api_url: str
) -> None:
    texts = [f"text number {i} about limits" for i in range(4)]
    rows = write_csv(tmp_path / "in.csv", texts)
    server.enqueued_token_limit = 3  # below any one input: no wait can end
    summary = run_flow(tmp_path, server, prefect_api_url)
    assert summary["exit_code"] == 3, summary["message"]
    message = summary["message"]
    assert "enqueued-token limit" in message and "--batch-fallback sync" in message, message
    assert server.batch_counters()["batch_inputs"] == 0
    done = run_flow(tmp_path, server, prefect_api_url, batch_fallback="sync")
    assert done["exit_code"] == 0, done["message"]
    assert_exact(tmp_path, rows)
    charged_at_most_once(server)
