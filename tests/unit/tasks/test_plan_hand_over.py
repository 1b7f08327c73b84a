"""The plan the CLI made before Prefect started is the flow's, unless the file changed
(``hand_over_plan``)."""

from __future__ import annotations

import os
from pathlib import Path

from adapters.csv_source import plan_csv
from adapters.plan_hand_over import hand_over_plan

PLAN_ARGS = dict(
    id_column="id",
    text_column="text",
    codec="auto",
    chunk_size=2,
    model="m",
    dimensions=None,
    delimiter="auto",
)


def _csv(path: Path, texts: list[str]) -> Path:
    path.write_text(
        "id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)), encoding="utf-8"
    )
    return path


def test_a_handed_over_plan_is_used_once_and_not_after_the_file_changed(tmp_path: Path) -> None:
    path = _csv(tmp_path / "in.csv", ["a", "b", "c"])
    plan = plan_csv(path, **PLAN_ARGS)
    hand_over_plan(plan, path, **PLAN_ARGS)
    assert plan_csv(path, **PLAN_ARGS) is plan
    assert plan_csv(path, **PLAN_ARGS) is not plan  # once
    hand_over_plan(plan, path, **PLAN_ARGS)
    assert plan_csv(path, **{**PLAN_ARGS, "chunk_size": 3}) is not plan  # other arguments
    hand_over_plan(plan, path, **PLAN_ARGS)
    _csv(path, ["a", "b", "d"])  # same size: the mtime tells
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    replanned = plan_csv(path, **PLAN_ARGS)
    assert replanned.sha256 != plan.sha256 and replanned.chunks[1].key != plan.chunks[1].key
