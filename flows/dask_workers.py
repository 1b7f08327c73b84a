"""What the flow makes sure of on every Dask worker before the first chunk, on a local cluster
and on one given by ``--dask-address`` alike: the statistical profiler is off
(``NoProfiler``, a worker plugin, so workers that join later get it too) and the worker's
environment holds the settings the run's chunks need (``missing_settings``).

Runs in the worker processes: they must have this package installed (the same commit).
Imported only for ``--task-runner dask`` (it imports distributed).
"""

from __future__ import annotations

import os
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from embedline.settings import RunSettings

__all__ = [
    "API_KEY_NEED",
    "AWS_CREDENTIALS_NEED",
    "INPUT_FILE_NEED",
    "NoProfiler",
    "missing_settings",
    "worker_needs",
]

#: A worker's needs (``worker_needs``), by the name its message gives them.
API_KEY_NEED = "EMBEDLINE_API_KEY (or OPENAI_API_KEY)"
AWS_CREDENTIALS_NEED = (
    "AWS credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
)
#: A need for a local input: this prefix, then the input's absolute path on the flow's machine.
INPUT_FILE_NEED = "the input file "
_API_KEY_ENVS = ("EMBEDLINE_API_KEY", "OPENAI_API_KEY")
#: S3 endpoint variables botocore reads (adapters/object_store/s3.py ``_build_client``).
_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

#: The worker's periodic callbacks of the statistical profiler (distributed/worker.py:
#: ``trigger_profile`` every 10 ms calls ``sys._current_frames()``, ``cycle_profile``).
_PROFILER_CALLBACKS = ("profile", "profile-cycle")


class NoProfiler(WorkerPlugin):
    """A Dask worker plugin (``Client.register_plugin``) that stops a worker's statistical
    profiler: ``distributed.worker.profile.enabled`` is read once, as a worker starts, so a
    running worker is changed by stopping the profiler's periodic callbacks instead.

    The profiler calls ``sys._current_frames()`` every 10 ms, which on CPython 3.11 can
    deadlock a worker whose threads allocate (CPython gh-106883/gh-116969,
    dask/distributed#8616). Dask calls ``setup`` on every worker now and on each that joins
    later.
    """

    name = "embedline-no-profiler"
    idempotent = True

    def setup(self, worker: Any) -> None:
        import dask.config

        dask.config.set({"distributed.worker.profile.enabled": False})  # later servers
        for name in _PROFILER_CALLBACKS:
            callback = worker.periodic_callbacks.pop(name, None)
            if callback is not None:
                callback.stop()


def worker_needs(settings: RunSettings, flow_env: dict[str, str]) -> tuple[str, ...]:
    """What a worker's environment must hold for this run's chunks, as worker checks name it.

    The API key when the openai embedder needs one: OpenAI's own API, or any base URL when
    the flow's process has a key (``flow_env``: its environment), which the chunks then
    send. AWS credentials when the input or output is on S3, and the S3 endpoint variable
    the flow's process sets (without it a worker would write to AWS instead). A local input
    (a path, ``file://``): the file itself, at the same absolute path (a filesystem the
    workers share), since each chunk task reads its own bytes of the input.
    """
    needs: list[str] = []
    if settings.embedder == "openai" and (
        settings.requires_api_key or any(flow_env.get(name) for name in _API_KEY_ENVS)
    ):
        needs.append(API_KEY_NEED)
    if settings.output.startswith("s3://") or settings.input.startswith("s3://"):
        needs.append(AWS_CREDENTIALS_NEED)
        needs += [name for name in _ENDPOINT_ENVS if flow_env.get(name)][:1]
    if "://" not in settings.input or settings.input.startswith("file://"):
        needs.append(INPUT_FILE_NEED + os.path.abspath(settings.input.removeprefix("file://")))
    return tuple(needs)


def missing_settings(needs: tuple[str, ...]) -> list[str]:
    """Those of ``needs`` (``worker_needs``) this process's environment lacks; run on each
    worker (``Client.run``). Reads whether a value is set, never shows one."""
    import os

    missing = []
    for need in needs:
        if need == API_KEY_NEED:
            ok = any(os.environ.get(name) for name in _API_KEY_ENVS)
        elif need == AWS_CREDENTIALS_NEED:
            ok = _aws_credentials_found()
        elif need.startswith(INPUT_FILE_NEED):
            ok = os.access(need.removeprefix(INPUT_FILE_NEED), os.R_OK)
        else:
            ok = bool(os.environ.get(need))
        if not ok:
            missing.append(need)
    return missing


def _aws_credentials_found() -> bool:
    """Whether boto3's credential chain (environment, profile, role) finds credentials."""
    import boto3

    return boto3.session.Session().get_credentials() is not None
