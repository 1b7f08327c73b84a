"""``flows.signals.signal_grace_s``: under a Prefect runner the grace period ends before the
runner's SIGKILL, which comes 30 s after its SIGTERM (Prefect 3.9); elsewhere it is as asked."""

from __future__ import annotations

import pytest

from embedline.shutdown import STOP
from flows.signals import RUNNER_KILL_AFTER_S, signal_grace_s


def test_under_a_prefect_runner_the_grace_ends_10_s_before_the_runners_sigkill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "0b1e3c8e-3f0e-4a55-9d0e-7f1c2a9b8c7d")
    monkeypatch.setattr(STOP, "_run_by_command", False)
    assert signal_grace_s(120.0) == RUNNER_KILL_AFTER_S - 10 == 20.0
    assert signal_grace_s(30.0) == 20.0  # the default lost the race before
    assert signal_grace_s(5.0) == 5.0


@pytest.mark.parametrize("runner_env, run_by_cli", [(False, False), (True, True)])
def test_elsewhere_the_grace_is_as_asked(
    monkeypatch: pytest.MonkeyPatch, runner_env: bool, run_by_cli: bool
) -> None:
    """A flow run in the CLI's process (or the user's own code) has no runner to kill it."""
    if runner_env:
        monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "0b1e3c8e-3f0e-4a55-9d0e-7f1c2a9b8c7d")
    else:
        monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    monkeypatch.setattr(STOP, "_run_by_command", run_by_cli)
    assert signal_grace_s(120.0) == 120.0
