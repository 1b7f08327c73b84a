"""The progress artifact never holds the run up once the Prefect API is gone."""

from __future__ import annotations

import threading
import time

import pytest

from embedline.shutdown import STOP
from embedline.stop_report import ApiLoss
from flows.artifacts import ProgressArtifact


def test_close_stops_waiting_for_a_post_when_the_api_is_found_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A post to a server that just died is retried by Prefect's client for a minute; the
    API loss is found while ``close`` waits for it (the watchdog needs 2 s of refusals).
    Before, close waited its whole 5 s, which held the commit of a finished run."""
    monkeypatch.setattr(STOP.report, "_api_loss", None)  # restored after the test
    artifact = object.__new__(ProgressArtifact)  # no API: only close() is under test
    artifact._closed, artifact._wake = threading.Event(), threading.Event()
    artifact._thread = threading.Thread(target=time.sleep, args=(10,), daemon=True)  # retrying
    artifact._thread.start()
    threading.Timer(0.3, STOP.report.note_api_lost, args=(ApiLoss("gone", "rerun"),)).start()
    started = time.monotonic()
    artifact.close(timeout_s=5.0)
    assert time.monotonic() - started < 1.5


def test_the_load_summary_has_its_own_index_line_in_the_artifact_and_on_the_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.load import print_load_summary
    from embedline.summary import LoadSummary
    from flows.artifacts import load_markdown

    summary = LoadSummary(
        0,
        "loaded",
        "",
        sink="postgresql://app@db/v?table=t",
        run_key="ab" * 32,
        mode="replace",
        rows_loaded=63_904,
        chunks_total=64,
        chunks_loaded=64,
        wall_s=110.9,
        index_s=86.5,
        index_state="HNSW index built",
    )
    text = load_markdown(summary)
    assert "| index | HNSW index built in 86.5 s |" in text
    assert "| rows | 63,904 upserted now, 0 held before, 0 deleted |" in text
    assert "| mode | replace |" in text
    print_load_summary(summary.to_dict())
    out = capsys.readouterr().out.splitlines()
    assert "index      HNSW index built in 86.5 s" in out
    assert "wall time  110.9 s (the load, of which 86.5 s the index)" in out


def test_the_run_summary_artifact_of_run_with_sink_has_the_loads_own_section() -> None:
    from embedline.summary import LoadSummary, RunSummary
    from flows.artifacts import summary_markdown

    load = LoadSummary(
        0,
        "loaded",
        "",
        sink="qdrant+local:///q?collection=c",
        run_key="k" * 64,
        mode="changes",
        rows_loaded=70,
        rows_skipped=63_834,
        rows_deleted=3,
        wall_s=2.5,
        index_s=0.01,
        index_state="nothing to build",
    )
    run = RunSummary(
        0, "complete", "", run_key="k" * 64, output="out", wall_s=8.7, load=load.to_dict()
    )
    text = summary_markdown(run)
    assert "| wall time | 8.7 s (the run; the load below has its own) |" in text
    section = text.split("## Load into the sink", 1)[1]
    assert "| mode | changes |" in section
    assert "| rows | 70 upserted now, 63,834 held before, 3 deleted |" in section
    assert "| index | nothing to build in 0.0 s |" in section
    assert "| wall time | 2.5 s (the load, index included) |" in section
    assert "Load into the sink" not in summary_markdown(
        RunSummary(0, "complete", "", run_key="k" * 64)
    )


def test_the_run_summary_artifact_counts_texts_batches_answered_as_charged() -> None:
    from embedline.summary import RunSummary
    from flows.artifacts import summary_markdown

    run = RunSummary(
        0,
        "complete",
        "",
        run_key="k" * 64,
        output="out",
        inputs=10,
        batch_inputs=10,
        tokens=50,
        batch_tokens=50,
        batches=3,
    )
    text = summary_markdown(run, price_per_million_tokens=0.02)
    assert (
        "| inputs charged | 10 texts answered with vectors (10 of them in Batch API batches) |"
        in text
    )
    assert "| requests | 0 sent |" in text


def test_the_summary_names_inputs_charged_apart_from_requests_retried() -> None:
    """Rate-limited requests carry texts the provider does not charge: they are counted
    as retried, not added to the inputs (a summary said "texts sent 904,323" for 886,323
    charged)."""
    from embedline.summary import RunSummary
    from flows.artifacts import summary_markdown

    run = RunSummary(
        0,
        "complete",
        "",
        run_key="k" * 64,
        tokens=16_200_000,
        requests=904,
        inputs=886_323,
        requests_retried=18,
        inputs_retried=18_000,
    )
    text = summary_markdown(run)
    assert "| inputs charged | 886,323 texts answered with vectors |" in text
    assert (
        "| requests | 904 sent; 18 without vectors (18,000 texts: rate limited, server "
        "errors, timeouts, refusals; not charged) |" in text
    )
    assert "texts sent" not in text


def test_saved_is_the_rows_own_lengths_at_the_runs_measured_rate() -> None:
    """One long text sent (its 20,000 tokens reported for 27,000 estimated) and 900 short
    rows reused (9,000 estimated): the saved tokens scale the rows' own estimate (6,667),
    not 900 times the one text's 20,000."""
    from embedline.summary import saved_phrase, tokens_avoided

    measured = tokens_avoided(900, estimated=9_000, reported=20_000, bound=27_000)
    assert measured == {"tokens_saved": 6_667, "tokens_saved_measured": True}
    unmeasured = tokens_avoided(10, estimated=400, reported=0, bound=0)
    assert unmeasured == {"tokens_saved": 400, "tokens_saved_measured": False}
    assert tokens_avoided(0, estimated=0, reported=5, bound=9)["tokens_saved"] == 0
    assert saved_phrase(rows=900, tokens_saved=9_000, measured=True, price=0.02) == (
        "$0.00018: 9,000 tokens for 900 rows not sent (their lengths at the tokens per byte "
        "this run's answers reported)"
    )
    copied = saved_phrase(rows=10, tokens_saved=400, measured=False, price=None)
    assert copied.startswith("at most 400 tokens for 10 rows not sent")
