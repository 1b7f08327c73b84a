"""``flows.embed_csv.for_this_process``: a deployment's flow run has no command to rerun."""

from __future__ import annotations

import logging

import pytest

from flows.embed_csv import _REWORD, for_this_process, reword_run_logs

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


def _logged_as(logger: logging.Logger, msg: str, *args: object) -> str:
    """What a record ``logger`` would log (its filters applied) reads."""
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, msg, args, None)
    assert logger.filter(record)
    return record.getMessage()


@pytest.mark.parametrize("name", ["prefect.flow_runs", "prefect.task_runs"])
def test_a_deployments_run_logs_say_how_to_run_it_again_too(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "6cf9ea83-8fb9-46de-a1d9-e3fb978eb54a")
    logger = logging.getLogger(name)
    monkeypatch.setattr(logger, "filters", list(logger.filters))  # put back afterwards
    reword_run_logs()
    reword_run_logs()
    assert logger.filters.count(_REWORD) == 1
    assert _logged_as(logger, "stopped: %s", "rerun the same command to resume") == (
        "stopped: run it again (Retry on the flow run's page in the UI) to resume"
    )


def test_the_clis_run_logs_keep_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    logger = logging.getLogger("prefect.flow_runs")
    monkeypatch.setattr(logger, "filters", list(logger.filters))
    reword_run_logs()
    assert _logged_as(logger, "stopped: %s", "rerun the same command to resume") == (
        "stopped: rerun the same command to resume"
    )
