"""The dry run's rows line adds up to the input's rows, a delta night's empty texts included."""

from __future__ import annotations

import re

from flows.estimate import Estimate


def test_the_rows_line_adds_up_on_a_delta_night_with_an_empty_text() -> None:
    estimate = Estimate(
        "k" * 64,
        rows_total=63_899,
        rows_inherited=63_868,
        rows_to_write=30,
        new_texts=30,
        rows_empty_unwritten=1,
        chunks_to_send=1,
    )
    rows_line = next(line for line in estimate.lines() if line.startswith("rows "))
    counts = [int(n.replace(",", "")) for n in re.findall(r"[\d,]+\d|\d", rows_line)]
    assert counts[0] == sum(counts[1:]) == 63_899, rows_line
    write_line = next(line for line in estimate.lines() if line.startswith("to write "))
    assert write_line.endswith("30 new texts to send in 1 chunk"), write_line
    parts = [int(n) for n in re.findall(r"(\d+) (?:rows:|reused|duplicates|empty|new)", write_line)]
    assert parts[0] == sum(parts[1:]), write_line  # 30 rows: 0 + 0 + 0 + 30
