"""The progress artifact never holds the run up once the Prefect API is gone."""

from __future__ import annotations

import threading
import time

import pytest

from embedline.shutdown import STOP, ApiLoss
from tasks.report import ProgressArtifact


def test_close_stops_waiting_for_a_post_when_the_api_is_found_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A post to a server that just died is retried by Prefect's client for a minute; the
    API loss is found while ``close`` waits for it (the watchdog needs 2 s of refusals).
    Before, close waited its whole 5 s, which held the commit of a finished run."""
    monkeypatch.setattr(STOP, "_api_loss", None)  # restored after the test
    artifact = object.__new__(ProgressArtifact)  # no API: only close() is under test
    artifact._closed, artifact._wake = threading.Event(), threading.Event()
    artifact._thread = threading.Thread(target=time.sleep, args=(10,), daemon=True)  # retrying
    artifact._thread.start()
    threading.Timer(0.3, STOP.note_api_lost, args=(ApiLoss("gone", "rerun"),)).start()
    started = time.monotonic()
    artifact.close(timeout_s=5.0)
    assert time.monotonic() - started < 1.5
