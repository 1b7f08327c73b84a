"""The load plan from what the sink holds, and the mass-delete guard (tasks/load/sink_state.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.load.sink_state import MassDeleteError, check_delete_share, plan_load


def _run(*rows: tuple[str, str, int]) -> pa.Table:
    return pa.table(
        {
            "id": [r[0] for r in rows],
            "text_sha256": [r[1] for r in rows],
            "chunk": pa.array([r[2] for r in rows], pa.int32()),
        }
    )


def _held(*rows: tuple[str, str]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.string()),
            "text_sha256": pa.array([r[1] for r in rows], pa.string()),
        }
    )


def test_the_plan_upserts_what_the_sink_lacks_and_deletes_what_the_run_does_not_hold() -> None:
    run = _run(("a", "1", 0), ("b", "2", 0), ("c", "3", 1), ("d", "4", 1))
    # b holds another text, c is gone (deleted by someone else), x is not in the run
    plan = plan_load(run, _held(("a", "1"), ("b", "old"), ("d", "4"), ("x", "9")))
    assert plan.upsert == {0: frozenset({"b"}), 1: frozenset({"c"})}
    assert plan.delete == ["x"]
    assert plan.held == 4 and plan.rows_to_upsert == 2 and not plan.done


def test_already_loaded_only_when_the_sink_holds_exactly_the_run() -> None:
    run = _run(("a", "1", 0), ("b", "2", 0))
    assert plan_load(run, _held(("b", "2"), ("a", "1"))).done
    assert not plan_load(run, _held(("a", "1"))).done  # a row missing
    assert not plan_load(run, _held(("a", "1"), ("b", "2"), ("z", "0"))).done  # one extra
    assert plan_load(run, _held()).upsert == {0: frozenset({"a", "b"})}


def test_a_delete_above_the_share_is_refused_naming_the_counts_and_the_flag() -> None:
    check_delete_share(30, 60, 0.5, what="x")  # exactly half: allowed
    check_delete_share(58, 60, 1.0, what="x")
    check_delete_share(5, 0, 0.0, what="x")  # an empty table: nothing to lose
    with pytest.raises(MassDeleteError) as caught:
        check_delete_share(58, 60, 0.5, what="loading run abc into t")
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert "58 of 60 rows (97%)" in message and "--max-delete-fraction 0.97" in message
    assert "max_delete_fraction" in message and "\n" not in message


def test_the_load_artifact_says_a_refused_delete_with_its_counts_and_flag() -> None:
    from embedline.summary import LoadSummary
    from flows.artifacts import load_markdown, md_text

    message = (
        "loading run abc into t would delete 58 of 60 rows (97%), more than "
        "--max-delete-fraction 0.5 allows: nothing deleted. If the input really lost "
        "those rows, rerun with --max-delete-fraction 0.97"
    )
    text = load_markdown(
        LoadSummary(
            2, "delete_refused", message, sink="lancedb:///x?table=t", run_key="abc", mode="replace"
        )
    )
    # as written in the UI: GFM specials escaped
    assert f"**{md_text('delete_refused')}**: {md_text(message)}" in text


def test_with_kept_columns_a_metadata_edit_is_a_row_the_sink_lacks() -> None:
    run = _run(("a", "1", 0), ("b", "2", 0)).append_column("kept_sha256", pa.array(["k1", "k2"]))
    held = _held(("a", "1"), ("b", "2")).append_column("kept_sha256", pa.array(["k1", "old"]))
    assert plan_load(run, held).upsert == {0: frozenset({"b"})}
    assert plan_load(run, run.select(["id", "text_sha256", "kept_sha256"])).done
