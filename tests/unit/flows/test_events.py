"""The payloads of embedline's Prefect events: counts only, cost from the price."""

from __future__ import annotations

import json

from embedline.summary import LoadSummary, RunSummary
from flows.events import load_payload, run_payload


def _committed(**fields: object) -> RunSummary:
    base = dict(
        exit_code=0,
        status="complete",
        message="",
        run_key="ab" * 32,
        output="s3://bucket/out",
        manifest_uri="s3://bucket/out/manifests/x.json",
        rows_total=10,
        rows_published=8,
        rows_failed=2,
        tokens=2_500_000,
        rows_added=8,
        rows_changed=0,
        rows_removed=1,
        rows_unchanged=0,
    )
    return RunSummary(**{**base, **fields})  # type: ignore[arg-type]


def test_run_payload_carries_the_counts_and_the_cost_at_the_given_price() -> None:
    payload = run_payload(_committed(price_per_million_tokens=0.02))
    assert payload["dead_letters"] == 2 and payload["rows_published"] == 8
    assert payload["rows_removed"] == 1 and payload["tokens"] == 2_500_000
    assert payload["cost_usd"] == 0.05
    json.dumps(payload)  # JSON-ready: the event API and status --json take it as is


def test_run_payload_without_a_price_has_no_cost() -> None:
    assert run_payload(_committed())["cost_usd"] is None


def test_load_payload_names_the_sink_and_what_changed() -> None:
    summary = LoadSummary(
        0,
        "loaded",
        "",
        sink="postgresql://u@h/db?table=t",
        run_key="cd" * 32,
        mode="upsert",
        rows_loaded=7,
        rows_deleted=3,
    )
    payload = load_payload(summary)
    assert (payload["sink"], payload["mode"], payload["rows_loaded"], payload["rows_deleted"]) == (
        "postgresql://u@h/db?table=t",
        "upsert",
        7,
        3,
    )


def test_run_payload_prices_batch_tokens_at_half() -> None:
    payload = run_payload(_committed(price_per_million_tokens=0.02, batch_tokens=2_000_000))
    assert payload["cost_usd"] == 0.03  # 0.5 M sync at 0.02 + 2 M at 0.01 per million
    assert payload["batch_tokens"] == 2_000_000
