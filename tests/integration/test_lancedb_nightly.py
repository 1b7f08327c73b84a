"""Eight nightly loads into one LanceDB table: no commit conflict, disk use bounded.

On main, 2 of 8 such loads crashed in ``optimize()`` ("Retryable commit conflict …
preempted by concurrent transaction": the load held two handles on the table, one by the
user's URI, one by its ``?table=`` identity), and after 8 loads the table used 8.6× its live
data on disk in 44 versions (``optimize()`` kept Lance's default 7 days of versions).
"""

from __future__ import annotations

from pathlib import Path

import lancedb
import pytest

from tests.support.csv_data import ENGLISH, edit_rows, read_rows, write_rows
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.in_process import load_in_process, run_in_process

pytestmark = [pytest.mark.integration]


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_eight_nightly_loads_by_path_uri_never_conflict_and_keep_disk_use_bounded(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    """In process on the session's server (the loads were, on a temporary server of
    Prefect's own that the test process started: 35 s in CI with the two CLI runs)."""
    common = {"output": str(tmp_path / "out"), "ledger": str(tmp_path / "ledger.sqlite3")}
    rows = read_rows(ENGLISH, 300)
    runs = []
    for night in range(2):  # two runs (nightly exports), loaded in turn: every load writes
        rows = edit_rows(rows, removed=10, changed=20, added=0, seed=night)
        made = run_in_process(
            prefect_api_url,
            input=str(write_rows(tmp_path / "in.csv", rows)),
            embedder="openai",
            base_url=fake_openai.base_url,
            chunk_size=25,
            **common,
        )
        runs.append((made["run_key"], len(rows)))
    sink = str(tmp_path / "db" / "nightly.lance")  # the PATH/NAME.lance form: not the identity
    ratios = []
    for night in range(8):
        run_key, count = runs[night % 2]
        summary = load_in_process(
            prefect_api_url, to=sink, run=run_key, lancedb_keep_versions_s=0.0, **common
        )
        assert summary["status"] == "loaded", summary
        table = lancedb.connect(str(tmp_path / "db")).open_table("nightly")
        assert table.count_rows() == count
        ratios.append(_disk_bytes(tmp_path / "db" / "nightly.lance") / table.stats()["total_bytes"])
        versions = len(table.list_versions())
    # retention 0: only the latest version's files stay (plus manifests and transaction logs)
    assert versions <= 2, versions
    assert max(ratios) < 2.0, ratios
