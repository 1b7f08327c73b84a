"""``flows.embed_csv.for_this_process``: a deployment's flow run has no command to rerun."""

from __future__ import annotations

import pytest

from flows.embed_csv import for_this_process

LINE = "3 of 20 chunks not published; rerun the same command to retry only those chunks"


def test_a_flow_run_a_prefect_worker_started_says_how_to_run_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "6cf9ea83-8fb9-46de-a1d9-e3fb978eb54a")
    assert for_this_process(LINE) == (
        "3 of 20 chunks not published; run it again (Retry on the flow run's page in the UI) "
        "to retry only those chunks"
    )


def test_the_cli_keeps_its_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    assert for_this_process(LINE) == LINE
