"""``embedline.run.committed`` is one event per commit, however many processes commit the
same run: its id is the commit's (``flows.events``). A real Prefect server stores events and
drops an id it has seen."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_a_run_committed_twice_is_one_committed_event(
    tmp_path: Path,
    prefect_api_url: str,
) -> None:
    """Two identical commands at once both end ``complete`` (the second finds the manifest
    the first wrote) and each sent ``embedline.run.committed``: an automation on it fired
    twice. The event's id is the commit's, so the server keeps one; a new generation of the
    run, or the same run committed to another output, is a commit of its own."""
    import os
    import subprocess
    import sys
    import time
    import uuid

    from tests.support.fixtures import REPO

    run_key = uuid.uuid4().hex * 2
    code = (
        "from embedline.summary import RunSummary\n"
        "from flows.events import emit_run_committed\n"
        "from prefect.events.worker import EventsWorker\n"
        "for output, generation in (('/out', 0), ('/out', 0), ('/out', 1), ('/b', 0)):\n"
        f"    emit_run_committed(RunSummary(exit_code=0, status='complete', message='',\n"
        f"        run_key={run_key!r}, output=output, generation=generation))\n"
        "EventsWorker.drain_all(timeout=10)\n"
    )
    for _ in range(2):  # as two processes would
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": prefect_api_url},
        )
        assert done.returncode == 0, done.stderr
    query = {
        "filter": {
            "event": {"name": ["embedline.run.committed"]},
            "resource": {"id": [f"embedline.run.{run_key}"]},
        },
        "limit": 50,
    }
    generations: list[tuple[str, int]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the server stores events a batch at a time
        answer = httpx.post(f"{prefect_api_url}/events/filter", json=query, timeout=10)
        answer.raise_for_status()
        generations = sorted(
            (e["payload"]["output"], e["payload"]["generation"]) for e in answer.json()["events"]
        )
        if len(generations) >= 3:
            time.sleep(3)  # anything more would have come by now
            answer = httpx.post(f"{prefect_api_url}/events/filter", json=query, timeout=10)
            generations = sorted(
                (e["payload"]["output"], e["payload"]["generation"])
                for e in answer.json()["events"]
            )
            break
        time.sleep(0.5)
    assert generations == [("/b", 0), ("/out", 0), ("/out", 1)], generations
