"""What the flow makes sure of on each Dask worker (``flows.dask_workers``): the profiler's
periodic callbacks stopped, and the settings a run's chunks need found in the environment."""

from __future__ import annotations

from typing import Any

import pytest

from embedline.settings import RunSettings
from flows.dask_workers import (
    API_KEY_NEED,
    AWS_CREDENTIALS_NEED,
    INPUT_FILE_NEED,
    NoProfiler,
    missing_settings,
    worker_needs,
)


class _Callback:
    def __init__(self) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False


class _Worker:
    def __init__(self) -> None:
        self.periodic_callbacks: dict[str, Any] = {
            "profile": _Callback(),
            "profile-cycle": _Callback(),
            "heartbeat": _Callback(),
        }


def test_no_profiler_stops_the_profiler_callbacks_only() -> None:
    worker = _Worker()
    callbacks = worker.periodic_callbacks
    profile, heartbeat = callbacks["profile"], callbacks["heartbeat"]
    NoProfiler().setup(worker)
    assert not profile.running and heartbeat.running
    assert set(callbacks) == {"heartbeat"}  # a later start_periodic_callbacks starts none
    NoProfiler().setup(worker)  # again (a second run on the same cluster): nothing left to stop


def _settings(**kw: Any) -> RunSettings:
    return RunSettings(input="s3://bucket/in.csv", output="s3://bucket/out", **kw)


def test_the_api_key_is_needed_when_the_flow_sends_one() -> None:
    settings = _settings(embedder="openai", base_url="http://10.0.0.7:8000/v1")
    assert API_KEY_NEED in worker_needs(settings, {"EMBEDLINE_API_KEY": "k"})
    assert API_KEY_NEED not in worker_needs(settings, {})


def test_the_api_key_is_needed_for_openais_own_api() -> None:
    settings = _settings(embedder="openai", base_url="https://api.openai.com/v1")
    assert API_KEY_NEED in worker_needs(settings, {})


def test_s3_needs_credentials_and_the_flows_endpoint() -> None:
    needs = worker_needs(_settings(embedder="local"), {"AWS_ENDPOINT_URL": "http://s3:9000"})
    assert needs == (AWS_CREDENTIALS_NEED, "AWS_ENDPOINT_URL")


def test_missing_settings_names_what_the_environment_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("EMBEDLINE_API_KEY", "OPENAI_API_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    needs = (API_KEY_NEED, AWS_CREDENTIALS_NEED, "AWS_ENDPOINT_URL")
    assert missing_settings(needs) == [API_KEY_NEED, "AWS_ENDPOINT_URL"]
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://s3:9000")
    assert missing_settings(needs) == []


def test_a_local_input_is_needed_at_its_absolute_path_and_named_when_unreadable(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each chunk task reads its bytes of the input: a worker on a machine without the
    file stopped the run only after chunks were sent to it, with an InputError naming a
    file the user could see. Warm-up now names the worker and the file."""
    from flows.task_runner import _lacking_line

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.csv").write_text("id,text\n1,a\n")
    settings = RunSettings(input="in.csv", output="s3://bucket/out", embedder="local")
    need = INPUT_FILE_NEED + str(tmp_path / "in.csv")
    assert worker_needs(settings, {})[-1] == need
    assert missing_settings((need,)) == []  # this machine reads it
    gone = INPUT_FILE_NEED + str(tmp_path / "elsewhere.csv")
    assert missing_settings((gone,)) == [gone]

    class _Scheduler:
        @staticmethod
        def identity(n_workers: int) -> dict[str, Any]:
            return {"workers": {"tcp://10.0.0.9:1": {"name": "w-9"}}}

    class _Client:  # what flows.worker_watch.cluster_workers asks of a distributed.Client
        status, scheduler = "running", _Scheduler()

        def sync(self, func: Any, *args: Any, callback_timeout: float, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

    line = _lacking_line({"tcp://10.0.0.9:1": [gone]}, _Client())
    assert line.startswith("Dask worker tcp://10.0.0.9:1 (w-9) cannot read the input ")
    assert str(tmp_path / "elsewhere.csv") in line and "s3://" in line
