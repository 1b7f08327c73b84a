"""CLI pieces that need no process: argument errors and TSV output of dead letters."""

from __future__ import annotations

import pytest

from embedline.cli import _tsv_field, main


def test_dead_letter_ids_stay_one_tsv_field() -> None:
    assert _tsv_field("plain-id") == "plain-id"
    assert _tsv_field("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"


def test_bad_numbers_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "x.csv", "--chunk-size", "0"])
    assert info.value.code == 2
    assert "--chunk-size" in capsys.readouterr().err
