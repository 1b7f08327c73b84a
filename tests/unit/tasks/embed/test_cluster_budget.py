"""tasks.embed.cluster_budget: the scheduler's handler paces every worker's requests as one
process's pacer does, carries TPM corrections, and is installed once; the budget's name
belongs to the account, base URL and model, never showing the key. The round trip from a
worker is covered by tests/integration/test_dask_budget.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from embedline.settings import RunSettings
from tasks.embed.cluster_budget import HANDLER, budget_name, cluster_pacer, install_budget


def _scheduler() -> Any:
    scheduler = SimpleNamespace(handlers={})
    assert install_budget(scheduler) is True
    return scheduler


def test_handler_paces_requests_from_any_worker_as_one_budget() -> None:
    reserve = _scheduler().handlers[HANDLER]
    waits = [reserve(name="b", rpm=600, tpm=None, tokens=1) for _ in range(4)]
    # 600 RPM: one request every 0.1 s, whichever worker asks (no burst beyond one)
    assert waits[0] == pytest.approx(0.0, abs=0.01)
    assert waits[3] == pytest.approx(0.3, abs=0.01)
    other = reserve(name="other", rpm=600, tpm=None, tokens=1)
    assert other == pytest.approx(0.0, abs=0.01)  # another account's budget


def test_handler_applies_a_carried_tpm_correction_before_booking() -> None:
    reserve = _scheduler().handlers[HANDLER]
    assert reserve(name="b", rpm=None, tpm=6000, tokens=100) == pytest.approx(0.0, abs=0.01)
    # the first request used 200 tokens, not 100: the next waits for 200 (2 s at 100/s)
    wait = reserve(name="b", rpm=None, tpm=6000, tokens=100, estimated=100, used=200)
    assert wait == pytest.approx(2.0, abs=0.01)


def test_install_keeps_the_budgets_held() -> None:
    scheduler = _scheduler()
    reserve = scheduler.handlers[HANDLER]
    assert install_budget(scheduler) is False  # a second flow on the same cluster
    assert scheduler.handlers[HANDLER] is reserve


def test_budget_name_is_the_accounts_and_hides_the_key() -> None:
    settings = RunSettings(input="in.csv", base_url="https://api.example/v1")
    name = budget_name(settings, "sk-secret")
    assert "sk-secret" not in name and name.startswith("embedline-budget-")
    assert budget_name(settings, "sk-secret") == name
    assert budget_name(settings, "sk-other") != name
    other_url = RunSettings(input="in.csv", base_url="https://other.example/v1")
    assert budget_name(other_url, "sk-secret") != name


def test_no_cluster_pacer_outside_a_dask_worker() -> None:
    threads = RunSettings(input="in.csv", rpm=60)
    assert cluster_pacer(threads) is None
    no_limit = RunSettings(input="in.csv", task_runner="dask")
    assert cluster_pacer(no_limit) is None
