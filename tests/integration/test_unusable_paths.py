"""A ledger or a Prefect home that a run cannot use: one line naming the path and what to do,
exit 2, before anything is sent; a night that needs no Prefect server does not need its home.
Each was a flow run ending in a traceback (found by trying the CLI as a user would)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli

pytestmark = pytest.mark.integration


def _run(
    tmp_path: Path,
    server: FakeEmbeddingServer,
    name: str,
    ledger: str,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    done = run_cli(
        "run",
        name,
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        "out",
        "--ledger",
        ledger,
        "--chunk-size",
        "1",
        cwd=tmp_path,
        env=env,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("damage", ["random bytes", "a text file", "cut short"])
def test_a_damaged_ledger_is_one_line_before_any_request(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    prefect_api_url: str,
    damage: str,
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n1,alpha\n2,beta\n", encoding="utf-8")
    ledger = tmp_path / "ledger.sqlite3"
    if damage == "cut short":  # a real ledger, truncated mid-file
        assert _run(tmp_path, fake_openai, "in.csv", "ledger.sqlite3")[0] == 0
        ledger.write_bytes(ledger.read_bytes()[:6000])
        (tmp_path / "in.csv").write_text("id,text\n1,alpha\n2,gamma\n", encoding="utf-8")
    else:
        ledger.write_bytes(os.urandom(8192) if damage == "random bytes" else b"id,text\n" * 900)
    sent = fake_openai.counters()["inputs"]
    code, _, err = _run(tmp_path, fake_openai, "in.csv", "ledger.sqlite3")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "embedline: error: cannot use the ledger ledger.sqlite3"
    ), err
    assert "move it away" in lines[0]
    assert fake_openai.counters()["inputs"] == sent


def test_a_ledger_in_a_path_that_cannot_hold_one_is_one_line(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    prefect_api_url: str,
) -> None:
    (tmp_path / "in.csv").write_text("id,text\n1,alpha\n", encoding="utf-8")
    (tmp_path / "taken").mkdir()  # --ledger names a directory
    code, _, err = _run(tmp_path, fake_openai, "in.csv", "taken")
    assert code == 2, err
    assert err.strip().count("\n") == 0 and "cannot use the ledger taken" in err, err


def test_an_unusable_prefect_home_stops_only_a_run_that_needs_the_temporary_server(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without PREFECT_API_URL the CLI starts its own server, whose files go to
    PREFECT_HOME. A home that cannot be created was a PermissionError traceback, even for a
    rerun that needs no server at all (every chunk copied or published: no flow)."""
    from tests.support.prefect_home import fresh_prefect_home

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    (tmp_path / "in.csv").write_text("id,text\n1,alpha\n2,beta\n", encoding="utf-8")
    monkeypatch.setenv("PREFECT_HOME", str(fresh_prefect_home(tmp_path / "home")))
    assert _run(tmp_path, fake_openai, "in.csv", "ledger.sqlite3")[0] == 0
    (tmp_path / "blocker").write_text("a file where a directory should be", encoding="utf-8")
    unusable = {"PREFECT_HOME": str(tmp_path / "blocker" / "prefect")}
    (tmp_path / "night.csv").write_text("id,text\n2,beta\n1,alpha\n", encoding="utf-8")
    code, out, err = _run(tmp_path, fake_openai, "night.csv", "ledger.sqlite3", unusable)
    assert code == 0, err  # no flow needed: the server is never started
    assert "status     complete" in out
    assert "Traceback" not in err, err
    # a new text to send (the rows before kept: a night that removes most rows is refused
    # before it needs anything, by the mass-delete guard)
    (tmp_path / "new.csv").write_text("id,text\n1,alpha\n2,beta\n3,gamma\n", encoding="utf-8")
    sent = fake_openai.counters()["inputs"]
    code, _, err = _run(tmp_path, fake_openai, "new.csv", "ledger.sqlite3", unusable)
    assert code == 2, err
    assert "Traceback" not in err, err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("embedline: error: cannot start the temporary Prefect server")
    ), err
    assert "PREFECT_HOME" in err.strip().splitlines()[-1]
    assert fake_openai.counters()["inputs"] == sent
