"""The summary and progress artifacts as Prefect's UI shows them, in headless Chromium
(Debian's chromium, which ``make test`` installs: tests/support/chromium/install.sh):
tables render as tables, and no number or message is struck through. The UI's Markdown is
GitHub-flavoured: ``~…~`` strikes text through, shown as ``markdown-renderer__text--del``
(a control artifact checks that the check still sees it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

from embedline.progress import Progress, Usage
from embedline.summary import RunSummary
from flows.artifacts import progress_markdown, summary_markdown
from tests.support.netns import net_lab
from tests.support.prefect_server import start_prefect_server

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: how the UI (prefect-ui-library's markdown renderer) shows struck-through text
_STRUCK = re.compile(r"text--del|<del[ >]|<s[ >]")


def _rendered(
    ui: str,
    artifact_id: object,
    profile: Path,
    *,
    attempts: int = 3,
    inside: Callable[[list[str]], list[str]] = list,
) -> str:
    """The DOM of the UI's page of ``artifact_id`` once its scripts have run, the browser
    started by the command ``inside`` makes of its own (as is: on this machine).

    On a loaded machine Chromium can dump the page before the UI's app has mounted (an
    empty ``<div id="app">``: the UI's own start, not the artifact); such a dump is taken
    again, up to ``attempts`` times in all, and the last one returned."""
    dom = ""
    for _ in range(attempts):
        dom = _dump_dom(inside, f"{ui}/artifacts/artifact/{artifact_id}", profile)
        if "markdown-renderer" in dom:
            break
    return dom


def _dump_dom(inside: Callable[[list[str]], list[str]], url: str, profile: Path) -> str:
    result = subprocess.run(
        inside(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=20000",
                "--dump-dom",
                url,
            ]
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium: run tests/support/chromium/install.sh (make test does)"
)
def test_the_ui_shows_the_summary_and_progress_tables_without_strikethrough(
    prefect_api_url: str, tmp_path: Path
) -> None:
    summary = RunSummary(
        1,
        "incomplete",
        "stopped: ~2 of ~4 chunks",
        run_key="k" * 64,
        output="out",
        tokens=0,
        rows_reused=3,
        tokens_saved=12,
    )
    event = Progress(600, 3, 200, 1, 0, 0, 0)
    progress = progress_markdown(event, rows_per_s=52.0, eta_s=8.0, usage=Usage(requests=10))
    control = "| | |\n|---|---|\n| saved | ~$0.0000 (~0 tokens not sent) |\n"

    @flow
    def artifacts() -> list[object]:
        return [
            create_markdown_artifact(summary_markdown(summary, price_per_million_tokens=0.02)),
            create_markdown_artifact(progress),
            create_markdown_artifact(control),
        ]

    with temporary_settings(
        updates={PREFECT_API_URL: prefect_api_url, PREFECT_LOGGING_TO_API_ENABLED: False}
    ):
        summary_id, progress_id, control_id = artifacts()
    ui = prefect_api_url.removesuffix("/api")
    profile = tmp_path / "chromium"
    dom = _rendered(ui, control_id, profile)
    assert "tokens not sent" in dom and _STRUCK.search(dom), dom[-3000:]  # the check sees it
    for artifact_id, cells in [
        (summary_id, ["stopped: ~2 of ~4 chunks", "at most $0.00000024: 12 tokens"]),
        (progress_id, ["200 of 600 (33.3 %)", "52 (last 60 s)", "8 s"]),
    ]:
        dom = _rendered(ui, artifact_id, profile)
        assert "<table" in dom, dom[-3000:]
        for cell in cells:
            assert cell in dom, (cell, dom[-3000:])
        assert not _STRUCK.search(dom), dom[-3000:]


@pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium: run tests/support/chromium/install.sh (make test does)"
)
def test_a_server_bound_to_every_address_serves_its_ui_to_a_browser_on_another_machine(
    tmp_path: Path,
) -> None:
    """``deployments/server.py --host 0.0.0.0`` (a server for workers and people on other
    machines): a browser in another network namespace, which knows the server only by its
    address on the bridge, gets the UI and the UI gets its data (``PREFECT_UI_API_URL``
    relative to the page, not ``http://0.0.0.0:…``)."""
    home = tmp_path / "home"
    home.mkdir()
    with net_lab("ui") as lab:
        proc, api = start_prefect_server(home, ui=True, host="0.0.0.0")
        try:
            port = api.rsplit(":", 1)[1].removesuffix("/api")
            table = "| night | rows |\n|---|---|\n| first | 1,234 |\n"

            @flow
            def artifacts() -> object:
                return create_markdown_artifact(table)

            with temporary_settings(
                updates={
                    PREFECT_API_URL: f"http://127.0.0.1:{port}/api",
                    PREFECT_LOGGING_TO_API_ENABLED: False,
                }
            ):
                artifact_id = artifacts()
            browser = lab.add("browser")
            dom = _rendered(
                f"http://{lab.host_ip}:{port}",
                artifact_id,
                tmp_path / "chromium",
                inside=lambda argv: ["ip", "netns", "exec", browser.namespace, *argv],
            )
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    assert "<table" in dom and "1,234" in dom, dom[-3000:]
