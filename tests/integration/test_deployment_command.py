"""``embedline deployment`` for real: from a directory of the user's own, one command writes a
prefect.yaml for a CSV with a template and kept columns; ``prefect deploy`` of it and a run on
a process worker embed the file with the CLI's defaults (1,000-row chunks)."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.support.fake_openai import expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.output import read_local_output
from tests.support.prefect_server import start_prefect_worker, stop_prefect_worker

pytestmark = pytest.mark.integration

POOL = "embedline-own"
ROWS = 1_200  # two chunks at the CLI's default chunk size: 1,000 and 200 rows
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _prefect(*args: str, cwd: Path, timeout: float = 120) -> str:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def fake_api() -> Iterator[str]:
    """A fake embeddings server in its own process (the worker's flow run reaches it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_openai", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def _write_csv(path: Path) -> list[tuple[str, str, str]]:
    rows = [
        (f"pkg-{i:04d}", f"title {i}", f'package {i}: tools, "quoted"\nline two')
        for i in range(ROWS)
    ]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(("id", "title", "text"))
        writer.writerows(rows)
    return rows


def _wait_terminal(api: str, flow_run_id: str, log: Path, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=10).json()
        if run["state_type"] in TERMINAL:
            return run
        time.sleep(0.25)
    pytest.fail(f"flow run still {run.get('state_name')}; worker log:\n{log.read_text()[-4000:]}")


def test_one_command_writes_a_deployment_that_runs_with_the_cli_defaults(
    prefect_api_url: str, fake_api: str, tmp_path: Path
) -> None:
    api = prefect_api_url
    project = tmp_path / "project"  # the user's own directory, not the checkout
    project.mkdir()
    rows = _write_csv(project / "catalogue.csv")

    # ── one command writes the deployment ────────────────────────────────────────────────
    # fmt: off
    written = run_cli(
        "deployment", "catalogue-nightly", "catalogue.csv",
        "--text-template", "{title}\\n\\n{text}", "--keep-columns", "title",
        "--embedder", "openai", "--base-url", fake_api,
        "--cron", "30 2 * * *", "--timezone", "Europe/Berlin", "--work-pool", POOL,
        cwd=project,
    )
    # fmt: on
    assert written.returncode == 0, written.stderr
    assert "added deployment embed-csv/catalogue-nightly in prefect.yaml" in written.stdout
    config = yaml.safe_load((project / "prefect.yaml").read_text())
    (deployment,) = config["deployments"]
    assert deployment["parameters"] == {  # only what was given: chunk_size etc. are defaults
        "source": {
            "input": "catalogue.csv",
            "text_template": "{title}\n\n{text}",
            "keep_columns": ["title"],
        },
        "embedding": {"embedder": "openai", "base_url": fake_api},
    }
    assert deployment["schedules"] == [
        {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "active": True}
    ]

    # ── what `run` refuses at parse time, the command refuses: one line, exit 2 ──────────
    refused = run_cli("deployment", "x", "catalogue.csv", "--keep-columns", "id", cwd=project)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "embedline deployment: error: argument --keep-columns" in refused.stderr

    # ── prefect deploy it, from the user's directory; run it on a process worker ────────
    _prefect("work-pool", "create", POOL, "--type", "process", "--overwrite", cwd=project)
    _prefect(
        "--no-prompt", "deploy", "--prefect-file", "prefect.yaml", "--name", "catalogue-nightly",
        cwd=project,
    )  # fmt: skip
    deployed = httpx.get(f"{api}/deployments/name/embed-csv/catalogue-nightly", timeout=10).json()
    assert deployed["entrypoint"] == "flows.embed_csv.embed_csv"
    assert deployed["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(project)}}
    ]
    schema = deployed["parameter_openapi_schema"]
    properties = schema["properties"]  # the server keeps them by name: in form order
    assert sorted(properties, key=lambda name: properties[name]["position"]) == [
        "source",
        "embedding",
        "limits",
        "destination",
        "batch_mode",
    ]
    assert schema["properties"]["limits"]["default"]["chunk_size"] == 1000

    log = tmp_path / "worker.log"
    worker = start_prefect_worker(POOL, log)
    try:
        started = _prefect("deployment", "run", "embed-csv/catalogue-nightly", cwd=project)
        match = re.search(r"UUID: ([0-9a-f-]{36})", started)
        assert match, started
        run = _wait_terminal(api, match.group(1), log)
    finally:
        stop_prefect_worker(worker)
    assert run["state_type"] == "COMPLETED", run["state"]
    assert "limits" not in run["parameters"]  # the flow's default: the CLI's 1,000 rows

    # ── the output: two chunks of 1,000 and 200 rows, the template's text, the kept title ─
    manifest, vectors = read_local_output(project / "embedline-output")
    assert manifest["rows_published"] == ROWS
    assert sorted(e["rows"] for e in manifest["chunks"]) == [200, 1000]
    for row_id, title, text in rows[:: ROWS // 12]:
        np.testing.assert_allclose(
            vectors[row_id], expected_vector(f"{title}\n\n{text}"), rtol=1e-6
        )
    from embedline import read_embeddings

    frame = read_embeddings(str(project / "embedline-output"))
    titles = dict(zip(frame["id"], frame["title"], strict=True))
    assert titles == {row_id: title for row_id, title, _ in rows}
