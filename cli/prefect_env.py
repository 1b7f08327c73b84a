"""The Prefect environment of a CLI run: quiet offline defaults and the temporary server."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["configure_prefect_environment", "isolate_temporary_server"]

_PREFECT_DEFAULTS = {
    # A temporary Prefect server can take longer than Prefect's 20 s default to start on a
    # loaded 2-core machine (../shared/STACK-NOTES.md); no network here, so no telemetry.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # Adapters log to "embedline.*" (they never call Prefect): route those into run logs.
    "PREFECT_LOGGING_EXTRA_LOGGERS": "embedline",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def configure_prefect_environment() -> None:
    """Set embedline's Prefect defaults in ``os.environ`` where the user set nothing."""
    for name, value in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)


def isolate_temporary_server() -> None:
    """Start Prefect's temporary server (used when no PREFECT_API_URL is set) in its own
    session, and stop it on a hard exit.

    A terminal's Ctrl-C signals the whole foreground process group. Prefect 3.9 starts its
    temporary server as a plain child (prefect/server/api/server.py,
    ``SubprocessASGIServer._run_uvicorn_command``), so the server died with the first Ctrl-C
    and the run, meant to stop gracefully, hung on a dead API. Only the ``subprocess``
    reference inside that Prefect module is replaced; everything else is untouched.
    """
    import subprocess

    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return  # a configured server: not ours to manage
    from prefect.server.api import server as prefect_server

    from embedline import shutdown

    started: list[subprocess.Popen[Any]] = []

    class _NewSessionSubprocess:
        def __getattr__(self, name: str) -> Any:
            return getattr(subprocess, name)

        @staticmethod
        def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:  # noqa: N802
            process = subprocess.Popen(*args, start_new_session=True, **kwargs)
            started.append(process)
            return process

    prefect_server.subprocess = _NewSessionSubprocess()  # type: ignore[assignment]
    shutdown.on_hard_exit(lambda: [p.terminate() for p in started if p.poll() is None])
