"""One sink object (so one LanceDB table handle) per sink identity, whatever URI names it."""

from __future__ import annotations

from pathlib import Path

from tasks.load.task import sink_for


def test_every_uri_naming_one_lancedb_table_shares_one_sink(tmp_path: Path) -> None:
    # the flow opened the sink by the user's URI and its tasks by the identity: two handles
    # on one table, whose commits raced ("Retryable commit conflict … preempted")
    by_path = sink_for(str(tmp_path / "db" / "t.lance"))
    by_uri = sink_for(f"lancedb://{tmp_path}/db?table=t")
    assert by_path is by_uri
    assert sink_for(by_path.identity) is by_path
    assert sink_for(f"lancedb://{tmp_path}/db?table=other") is not by_path


def test_pgvector_uris_of_one_table_share_one_sink() -> None:
    first = sink_for("postgresql://app@db.example:5432/search?table=t")
    assert sink_for(first.identity) is first
