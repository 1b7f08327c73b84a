"""Token calibration: the arithmetic a dry run scales its estimate by, the ledger's
cumulative sums per endpoint and model, and the first-run estimate by script."""

from __future__ import annotations

import pytest

from adapters.embeddings import approximate_tokens
from adapters.ledger import Ledger
from embedline.calibration import (
    FIRST_RUN_METHOD,
    MIN_CALIBRATION_TOKENS,
    Calibration,
    calibrated,
)

URL = "http://127.0.0.1:9/v1"


def test_calibrated_scales_the_estimate_by_reported_over_estimated() -> None:
    cal = Calibration(URL, "m", reported=30_000, estimated=40_000)
    assert cal.ratio == 0.75
    tokens, method = calibrated(1_000, cal)
    assert tokens == 750
    assert method.startswith("calibrated by 30,000 tokens reported by this endpoint for m")


def test_calibrated_rounds_to_the_nearest_token() -> None:
    cal = Calibration(
        URL, "m", reported=MIN_CALIBRATION_TOKENS * 3, estimated=MIN_CALIBRATION_TOKENS * 2
    )
    assert calibrated(3, cal)[0] == 4  # 4.5 rounds to even
    assert calibrated(5, cal)[0] == 8  # 7.5


def test_below_the_threshold_the_first_run_estimate_stands() -> None:
    few = Calibration(URL, "m", reported=MIN_CALIBRATION_TOKENS - 1, estimated=1)
    assert not few.usable
    assert calibrated(1_234, few) == (1_234, FIRST_RUN_METHOD)
    assert calibrated(1_234, None) == (1_234, FIRST_RUN_METHOD)
    enough = Calibration(
        URL, "m", reported=MIN_CALIBRATION_TOKENS, estimated=MIN_CALIBRATION_TOKENS
    )
    assert enough.usable and calibrated(1_234, enough)[0] == 1_234


def test_nothing_estimated_is_never_usable() -> None:
    cal = Calibration(URL, "m", reported=MIN_CALIBRATION_TOKENS * 5, estimated=0)
    assert cal.ratio == 1.0 and not cal.usable


def test_the_ledger_sums_runs_per_endpoint_and_model() -> None:
    ledger = Ledger(":memory:")
    assert ledger.calibration(URL, "m") is None
    ledger.add_calibration(URL, "m", reported=700, estimated=1_000)
    ledger.add_calibration(URL + "/", "m", reported=800, estimated=1_000)  # same endpoint
    ledger.add_calibration(URL, "other", reported=5, estimated=10)
    ledger.add_calibration("http://elsewhere/v1", "m", reported=5, estimated=10)
    ledger.add_calibration(URL, "m", reported=0, estimated=50)  # no usage reported: ignored
    cal = ledger.calibration(URL, "m")
    assert cal == Calibration(URL, "m", reported=1_500, estimated=2_000)
    assert cal.ratio == 0.75
    assert ledger.calibration(URL, "other") == Calibration(URL, "other", 5, 10)


def test_the_calibration_survives_reopening(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "l.sqlite3"
    Ledger(path).add_calibration(URL, "m", reported=10, estimated=20)
    Ledger(path).add_calibration(URL, "m", reported=10, estimated=20)
    assert Ledger(path).calibration(URL, "m") == Calibration(URL, "m", 20, 40)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 1),  # at least 1
        ("hello world", 2),
        ("hello, world.", 4),  # punctuation counts
        ("internationalization", 3),  # 20 letters: one token per 9
        ("1234567", 3),  # digits in threes
        ("日本語のテキスト", 8),  # one per kana or ideograph
        ("Привет мир", 5),  # other scripts: one per 2 characters
    ],
)
def test_approximate_tokens_counts_by_script(text: str, tokens: int) -> None:
    assert approximate_tokens(text) == tokens
