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
