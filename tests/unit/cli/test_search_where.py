"""``search --where`` / ``--columns`` parsing, and the exact ranking every fallback uses."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.sinks.base import exact_top_k
from adapters.sinks.pg_search import _version
from cli.main import main


@pytest.mark.parametrize("bad", ["title", "=x", ""])
def test_a_where_without_column_and_equals_is_a_usage_error(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["search", "some-output", "a query", "--where", bad])
    assert info.value.code == 2
    assert "COLUMN=VALUE" in capsys.readouterr().err


def test_a_where_value_may_hold_equals_signs_and_quotes() -> None:
    from cli.search import _where

    assert _where("title=a=b 'c' %") == ("title", "a=b 'c' %")
    assert _where("title=") == ("title", "")


def test_exact_top_k_ranks_by_cosine_and_breaks_ties_by_row() -> None:
    matrix = np.array([[1, 0], [0, 1], [1, 0], [1, 1], [0, 0]], dtype=np.float32)
    hits = exact_top_k(
        matrix,
        ["a", "b", "c", "d", "z"],
        np.array([2, 0], np.float32),
        4,
        [["A", "B", "C", "D", "Z"]],
    )
    assert [h[0] for h in hits] == ["a", "c", "d", "b"]
    assert hits[0][2] == "A" and np.isclose(hits[2][1], 2**-0.5)
    assert exact_top_k(matrix[:0], [], np.array([1, 0], np.float32), 3) == []


def test_pgvector_versions_compare_as_numbers() -> None:
    assert _version("0.8.6") >= (0, 8, 0) > _version("0.6.2")
    assert _version("0.10.0") > (0, 8, 0)
    assert _version("garbled") < (0, 8, 0)
