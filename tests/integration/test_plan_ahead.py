"""``embedline run`` plans in a child process while it imports Prefect (cli/plan_ahead.py):
the plan is the one planning in-process makes, input errors read the same, a child that
dies is replaced by planning in-process, and no child outlives the CLI, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from adapters.csv_source import plan_csv
from adapters.row_facts import ROW_DTYPE
from adapters.scratch import Spill, release
from cli.plan_ahead import PlanAhead
from embedline.settings import RunSettings
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO, run_cli
from tests.support.processes import processes_with_env

pytestmark = pytest.mark.integration
_MARK = "EMBEDLINE_TEST_PLAN_AHEAD"


def _csv(path: Path, rows: int) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        fh.write("id,text\n")
        for i in range(rows):
            fh.write(f'r{i},"text {i % 997}\nsecond line of {i}"\n')
    return path


def _rows(plan: object) -> np.ndarray:
    spill = Spill(Path(plan.scratch) / "rows", ROW_DTYPE)  # type: ignore[attr-defined]
    return np.sort(
        np.concatenate([spill.read(b) for b in spill.partitions()]),
        order=["prefix", "chunk", "position"],
    )


def test_the_child_plans_what_planning_here_plans(tmp_path: Path) -> None:
    settings = RunSettings(
        input=str(_csv(tmp_path / "in.csv", 2500)),
        chunk_size=400,
        ledger=str(tmp_path / "ledger.sqlite3"),
    )
    here = plan_csv(settings.input, **settings.plan_arguments)
    ahead = PlanAhead.start(settings)
    assert ahead is not None
    try:
        child = ahead.plan(settings)
    finally:
        ahead.close()
    assert (child.sha256, child.rows, child.bytes) == (here.sha256, here.rows, here.bytes)
    assert child.chunks == here.chunks and child.source == here.source
    assert child.scratch == str(ahead.scratch.path) and child.scratch != here.scratch
    np.testing.assert_array_equal(_rows(child), _rows(here))  # the reuse stage's row hashes
    release(child.scratch)
    release(here.scratch)
    assert not Path(child.scratch).exists()


def test_the_child_plans_without_importing_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas at its first array unless the import fails (0.2 CPU s a
    run): the child's finder makes it fail, and planning and pyarrow still work."""
    data = _csv(tmp_path / "in.csv", 300)
    code = (
        "import sys\n"
        "from cli.plan_ahead import _NoPandas\n"
        "sys.meta_path.insert(0, _NoPandas())\n"
        "from adapters.csv_source import plan_csv\n"
        "from adapters.scratch import release\n"
        "import pyarrow as pa\n"
        f"plan = plan_csv({str(data)!r}, id_column='id', text_column='text', codec='auto',\n"
        f"                chunk_size=100, model='m', dimensions=None,\n"
        f"                scratch_root={str(tmp_path)!r})\n"
        "assert plan.rows == 300 and len(plan.chunks) == 3, plan.rows\n"
        "assert pa.array([1, 2]).to_numpy().tolist() == [1, 2]\n"
        "release(plan.scratch)\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_child_that_dies_is_replaced_by_planning_here(tmp_path: Path) -> None:
    settings = RunSettings(
        input=str(_csv(tmp_path / "in.csv", 300)),
        chunk_size=100,
        ledger=str(tmp_path / "ledger.sqlite3"),
    )
    ahead = PlanAhead.start(settings)
    assert ahead is not None
    os.kill(ahead.proc.pid, signal.SIGKILL)
    plan = ahead.plan(settings)
    ahead.close()
    assert plan.rows == 300 and len(plan.chunks) == 3
    assert plan.scratch is not None and Path(plan.scratch).is_dir()
    assert not ahead.scratch.path.exists()  # the child's directory went with it
    release(plan.scratch)


@pytest.mark.usefixtures("prefect_api_url")
def test_an_input_error_found_by_the_child_reads_as_before(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n1,a\n2,b\n1,c\n", encoding="utf-8")
    done = run_cli(
        "run", "in.csv", "--embedder", "openai", "--base-url", fake_openai.base_url, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "in.csv:4" in done.stderr and "duplicate" in done.stderr.lower()
    assert "Traceback" not in done.stderr
    assert fake_openai.counters()["requests"] == 0
    assert not (tmp_path / ".embedline" / "scratch").exists()  # its last directory gone


def _children_planning(marker: str, cli_pid: int) -> list[int]:
    """The CLI's live children (they inherit its environment's marker)."""
    return [pid for pid in processes_with_env(_MARK, marker) if pid != cli_pid]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
@pytest.mark.usefixtures("prefect_api_url")
def test_no_planning_child_outlives_the_cli(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, how: signal.Signals
) -> None:
    _csv(tmp_path / "big.csv", 400_000)  # about a second of planning
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "run",
            "big.csv",
            "--embedder",
            "openai",
            "--base-url",
            fake_openai.base_url,
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), _MARK: str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children = lambda: _children_planning(str(tmp_path), proc.pid)  # noqa: E731
    try:
        scratch, planning = tmp_path / ".embedline" / "scratch", False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not planning and proc.poll() is None:
            # planning started: the child read its request and cleared the directory
            planning = (
                bool(children())
                and scratch.is_dir()
                and not list(scratch.glob("*/plan-ahead.request"))
                and bool(list(scratch.iterdir()))
            )
            time.sleep(0.005)
        assert planning, "no planning child seen at work"
        proc.send_signal(how)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and children():
        time.sleep(0.05)
    assert children() == []
    # stopped, not finished: a child left running would have written its plan by now
    left = list((tmp_path / ".embedline" / "scratch").glob("*/plan-ahead.result"))
    assert left == []
    if how == signal.SIGINT:
        assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
        scratch = tmp_path / ".embedline" / "scratch"
        assert not scratch.exists() or list(scratch.iterdir()) == []
    assert fake_openai.counters()["requests"] == 0


@pytest.mark.usefixtures("prefect_api_url")
def test_an_input_the_child_cannot_open_as_the_cli_does_is_planned_here(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """``/dev/stdin`` (and ``/dev/fd/N``) name the CLI's own descriptors: a child opening
    the path read nothing ("the file is empty", exit 2, found by a break test)."""
    source = _csv(tmp_path / "in.csv", 50)
    with source.open("rb") as stdin:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli",
                "run",
                "/dev/stdin",
                "--embedder",
                "openai",
                "--base-url",
                fake_openai.base_url,
            ],
            cwd=tmp_path,
            stdin=stdin,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "50 published of 50" in done.stdout
