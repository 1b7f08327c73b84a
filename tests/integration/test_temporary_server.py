"""The CLI's temporary Prefect server starts lean: it is on every first run's critical path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import REPO
from tests.support.forked_cli import popen_cli
from tests.support.prefect_home import fresh_prefect_home


def test_the_temporary_server_does_not_import_the_installed_prefect_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefect's block registration (and the hash that memoizes it) imports every installed
    collection at start: prefect-dask brought dask, distributed and numpy into the server,
    0.4 s of its 4-5 s start. numpy's C core in the server's memory map shows it."""
    from cli.local_server import LocalServer

    monkeypatch.setenv("PREFECT_HOME", str(fresh_prefect_home(tmp_path / "home")))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    server = LocalServer().start()
    try:
        server.wait_ready(120)
        assert server.process is not None
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    finally:
        server.stop()
    assert "_multiarray_umath" not in maps, "numpy was imported by the temporary server"
    assert os.environ.get("PREFECT_API_BLOCKS_REGISTER_ON_START") is None  # the CLI's own env


def test_what_the_cli_imports_while_the_server_starts_is_what_a_flow_run_imports(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    """The CLI imports ``_IMPORTED_BY_THE_FLOW`` while the temporary server starts, so a flow
    run does not import them on its critical path (0.4 s of CPU). A fresh interpreter that
    imported the flow module then runs a flow: each of those modules must be among what
    that run imported, or the list has gone stale (a Prefect or pyarrow upgrade)."""
    from cli.run import _IMPORTED_BY_THE_FLOW

    (tmp_path / "in.csv").write_text("id,text\n1,a\n2,b\n3,c\n", encoding="utf-8")
    script = f"""
import json, sys
from embedline.parameters import grouped
from flows.embed_csv import embed_csv
before = set(sys.modules.copy())
state = embed_csv(**grouped(dict(input={str(tmp_path / "in.csv")!r},
                  output={str(tmp_path / "out")!r}, ledger={str(tmp_path / "ledger.sqlite3")!r},
                  embedder="openai", base_url={fake_openai.base_url!r}, chunk_size=2)),
                  return_state=True)
assert state.is_completed(), state
print(json.dumps(sorted(set(sys.modules.copy()) - before)))
"""
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert set(_IMPORTED_BY_THE_FLOW) <= imported, set(_IMPORTED_BY_THE_FLOW) - imported


def test_four_clis_started_at_once_on_a_fresh_prefect_home_all_succeed(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """A fresh ``PREFECT_HOME`` (a new container, a new user) and several runs started at
    once (a shell loop, a cron minute): each CLI's temporary server would create and migrate
    the same new SQLite database, and one of them died. Each run embeds texts of its own, so
    the fake's charges say every run finished its work exactly once."""
    home = tmp_path / "fresh-home"  # does not exist yet: nothing set up
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(home), PYTHONPATH=str(REPO), OPENAI_API_KEY="sk-test")
    runs = []
    for n in range(4):
        work = tmp_path / f"run{n}"
        work.mkdir()
        rows = "".join(f"{i},run {n} text {i}\n" for i in range(20))
        (work / "in.csv").write_text("id,text\n" + rows, encoding="utf-8")
        args = ["run", "in.csv", "--embedder", "openai", "--base-url", fake_openai.base_url]
        runs.append(
            popen_cli(
                [sys.executable, "-m", "cli", *args],
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outcomes = [run.communicate(timeout=300) for run in runs]
    for run, (_, err) in zip(runs, outcomes, strict=True):
        assert run.returncode == 0, err[-3000:]
    charged = fake_openai.charged_texts()
    assert len(charged) == 80 and set(charged.values()) == {1}
