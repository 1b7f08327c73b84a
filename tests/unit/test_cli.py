"""CLI pieces that need no process: argument errors and TSV output of dead letters."""

from __future__ import annotations

import pytest

from cli import main
from cli.inspect import tsv_field


def test_dead_letter_ids_stay_onetsv_field() -> None:
    assert tsv_field("plain-id") == "plain-id"
    assert tsv_field("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"


def test_bad_numbers_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "x.csv", "--chunk-size", "0"])
    assert info.value.code == 2
    assert "--chunk-size" in capsys.readouterr().err


def test_flow_heartbeats_are_off_only_with_the_clis_temporary_server() -> None:
    """Prefect joins the heartbeat thread at the end of every flow run (up to 1 s); only a
    configured server can use heartbeats (crashed-run detection)."""
    from types import SimpleNamespace

    from prefect.settings import get_current_settings

    from cli.run import _no_heartbeats

    configured = get_current_settings().flows.heartbeat_frequency
    with _no_heartbeats(SimpleNamespace(server=object())):
        assert get_current_settings().flows.heartbeat_frequency is None
    with _no_heartbeats(SimpleNamespace(server=None)):
        assert get_current_settings().flows.heartbeat_frequency == configured
    assert configured is not None
