"""The plan the CLI made before Prefect started is the flow's, unless the file changed
(``flows.session.Session.take_plan``)."""

from __future__ import annotations

import os
from pathlib import Path

from adapters.csv_source import plan_csv
from embedline.settings import RunSettings
from flows.session import Session


def _settings(path: Path, **overrides: object) -> RunSettings:
    return RunSettings.from_parameters(
        {"input": str(path), "chunk_size": 2, "ledger": str(path.parent / "l.db"), **overrides}
    )


def _csv(path: Path, texts: list[str]) -> Path:
    path.write_text(
        "id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)), encoding="utf-8"
    )
    return path


def test_a_handed_over_plan_is_used_once_and_not_after_the_file_changed(tmp_path: Path) -> None:
    path = _csv(tmp_path / "in.csv", ["a", "b", "c"])
    settings = _settings(path)
    plan = plan_csv(settings.input, **settings.plan_arguments)
    session = Session.for_plan(settings, plan)
    assert session.take_plan(settings) is plan
    assert session.take_plan(settings) is None  # once
    session = Session.for_plan(settings, plan)
    assert session.take_plan(_settings(path, chunk_size=3)) is None  # other arguments
    session = Session.for_plan(settings, plan)
    _csv(path, ["a", "b", "d"])  # same size: the mtime tells
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert session.take_plan(settings) is None
    replanned = plan_csv(settings.input, **settings.plan_arguments)
    assert replanned.sha256 != plan.sha256 and replanned.chunks[1].key != plan.chunks[1].key
