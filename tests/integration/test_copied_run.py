"""``embedline run`` publishes a night whose every row an earlier object holds before Prefect
starts (flows/copied_run.py): no request, no flow run, the vectors the fake server gives
for those texts; and a night with something to send hands its prepared reuse stage to the
flow, which prepares nothing again. A real CLI, fake server and Prefect server."""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.output import vectors_by_id

pytestmark = pytest.mark.integration


def _csv(path: Path, rows: list[tuple[str, str]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(("id", "text"))
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")


def _run(
    tmp_path: Path, server: FakeEmbeddingServer, name: str, *extra: str
) -> tuple[int, str, str]:
    result = run_cli(
        "run",
        str(tmp_path / name),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "40",
        *extra,
        cwd=tmp_path,
    )
    return result.returncode, result.stdout, result.stderr


def _flow_runs(api_url: str) -> int:
    answer = httpx.post(f"{api_url}/flow_runs/count", json={}, timeout=10)
    answer.raise_for_status()
    return int(answer.json())


def _latest_vectors(out: Path, run_key_line: str) -> dict[str, np.ndarray]:
    import json

    run_key = run_key_line.split()[1]
    manifest = json.loads((out / "manifests" / f"{run_key}.json").read_text())
    bodies = {e["object"]: (out / e["object"]).read_bytes() for e in manifest["chunks"]}
    return vectors_by_id(bodies, manifest)


@pytest.mark.parametrize(
    ("night_args", "said"),
    [
        ((), "rows       200 published of 200 (200 already published before)"),  # a delta
        (("--compact",), "200 rows reused from earlier runs"),  # whole objects, copied
    ],
    ids=["delta night", "compaction"],
)
def test_an_all_copied_night_sends_nothing_and_runs_no_flow(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    prefect_api_url: str,
    night_args: tuple[str, ...],
    said: str,
) -> None:
    rows = [(f"pkg-{i}", f"package {i} does thing {i * 13 % 97}") for i in range(200)]
    _csv(tmp_path / "first.csv", rows)
    code, _, err = _run(tmp_path, fake_openai, "first.csv")
    assert code == 0, err
    sent, flows = fake_openai.counters()["inputs"], _flow_runs(prefect_api_url)
    assert sent == 200
    shuffled = list(rows)
    random.Random(5).shuffle(shuffled)  # every chunk key new, every row in an earlier object
    _csv(tmp_path / "night.csv", shuffled)
    code, out, err = _run(tmp_path, fake_openai, "night.csv", *night_args)
    assert code == 0, err
    assert said in out
    assert fake_openai.counters()["inputs"] == sent  # nothing sent
    assert _flow_runs(prefect_api_url) == flows  # no flow run: published before Prefect
    assert "WARNING" not in err and "Traceback" not in err, err  # the commit's event, sent
    run_line = next(line for line in out.splitlines() if line.startswith("run "))
    vectors = _latest_vectors(tmp_path / "out", run_line)
    assert sorted(vectors) == sorted(i for i, _ in rows)
    for row_id, text in shuffled:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)


def test_a_night_with_one_change_hands_its_prepared_stage_to_the_flow(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    prefect_api_url: str,
) -> None:
    rows = [(f"pkg-{i}", f"package {i} does thing {i * 13 % 97}") for i in range(200)]
    _csv(tmp_path / "first.csv", rows)
    assert _run(tmp_path, fake_openai, "first.csv")[0] == 0
    sent, flows = fake_openai.counters()["inputs"], _flow_runs(prefect_api_url)
    night = list(rows)
    random.Random(6).shuffle(night)
    night[17] = (night[17][0], "a text no earlier run embedded")
    _csv(tmp_path / "night.csv", night)
    code, out, err = _run(tmp_path, fake_openai, "night.csv")
    assert code == 0, err
    assert fake_openai.counters()["inputs"] == sent + 1  # only the changed text
    assert _flow_runs(prefect_api_url) == flows + 1
    stage_lines = [line for line in err.splitlines() if "reuse stage:" in line]
    assert len(stage_lines) == 1, stage_lines  # prepared once, before the flow
    assert stage_lines[0].endswith("before the flow started"), stage_lines
    run_line = next(line for line in out.splitlines() if line.startswith("run "))
    vectors = _latest_vectors(tmp_path / "out", run_line)
    for row_id, text in night:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)


def test_an_embedline_warning_outside_a_flow_run_prints_only_itself(
    tmp_path: Path,
    prefect_api_url: str,
) -> None:
    """The CLI logs on ``embedline.*`` before Prefect runs a flow (a night of copied rows
    and its graceful stop): with Prefect imported and a configured server, its API log
    handler printed a UserWarning and its source line beside each such line."""
    import os
    import subprocess
    import sys

    from tests.support.fixtures import REPO

    code = (
        "import logging\n"
        "from cli.prefect_env import configure_prefect_environment\n"
        "configure_prefect_environment()\n"
        "from prefect.logging.configuration import setup_logging\n"
        "setup_logging()  # as the CLI's import of the flow does\n"
        "logging.getLogger('embedline.run').warning('SIGTERM received: no new chunks')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": prefect_api_url},
    )
    assert done.returncode == 0, done.stderr
    assert "SIGTERM received: no new chunks" in done.stderr
    assert "UserWarning" not in done.stderr and "flow run id" not in done.stderr, done.stderr


def test_with_the_temporary_server_a_copied_night_starts_no_server(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without PREFECT_API_URL, a rerun whose ledger indexes its output starts Prefect only
    once a flow is needed (``cli.plan_ahead.prefect_on_demand``): a night of copied rows
    starts no temporary server (3.1 CPU s of a 12 s 1M-row night), a night with one change
    starts it then, and both publish the fake server's vectors. The server's log file,
    created when it is spawned, tells."""
    from tests.support.prefect_home import fresh_prefect_home

    home = fresh_prefect_home(tmp_path / "home")
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    server_log = home / "embedline-temporary-server.log"
    server_log.unlink(missing_ok=True)
    rows = [(f"pkg-{i}", f"package {i} does thing {i * 13 % 97}") for i in range(200)]
    _csv(tmp_path / "first.csv", rows)
    assert _run(tmp_path, fake_openai, "first.csv")[0] == 0
    assert server_log.exists()  # a first run starts the server at once
    sent = fake_openai.counters()["inputs"]
    for seed, change in ((7, False), (8, True)):
        server_log.unlink(missing_ok=True)
        night = list(rows)
        random.Random(seed).shuffle(night)
        if change:
            night[3] = (night[3][0], "a text no earlier run embedded")
        _csv(tmp_path / "night.csv", night)
        code, out, err = _run(tmp_path, fake_openai, "night.csv")
        assert code == 0, err
        assert fake_openai.counters()["inputs"] == sent + change
        assert server_log.exists() is change, err
        run_line = next(line for line in out.splitlines() if line.startswith("run "))
        vectors = _latest_vectors(tmp_path / "out", run_line)
        for row_id, text in night:
            np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)
        sent = fake_openai.counters()["inputs"]
