"""The Prefect environment of a CLI run: quiet offline defaults and which API server to use.

With ``PREFECT_API_URL`` set (environment or Prefect profile), that server must answer before
anything starts; without it the CLI starts its own temporary server (``cli.local_server``)
and exports its URL, so the flow, its tasks and Dask workers all talk to that one server.
"""

from __future__ import annotations

import os
import sys

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cli.local_server import LocalServer

__all__ = ["PrefectApiError", "configure_prefect_environment", "prefect_api"]

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
_CHECK_TIMEOUT_S = 5.0  # seconds to wait for a configured server's /health


class PrefectApiError(RuntimeError):
    """No usable Prefect API: the message is one line that says what to do (exit 2)."""


def configure_prefect_environment() -> None:
    """Set embedline's Prefect defaults in ``os.environ`` where the user set nothing."""
    for name, value in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)


class PrefectApi:
    """The API this run uses: a configured server, or the CLI's temporary ``server``."""

    def __init__(self, url: str, server: LocalServer | None) -> None:
        self.url = url
        self.server = server
        self._closing = False

    def watch(self, poll_s: float = 0.5) -> None:
        """Exit this process (code 1, one line) if the temporary server dies before
        ``close``: without it the flow waited minutes on a dead API, then printed a
        traceback. Published chunks are safe (the store is the truth: the next run adopts
        objects the ledger missed, reclaims chunks of this dead process at once)."""
        import threading
        import time

        from embedline import shutdown

        server = self.server
        if server is None:
            return

        def watchdog() -> None:
            while server.alive() or self._closing:
                if self._closing:
                    return
                time.sleep(poll_s)
            sys.stderr.write(
                f"embedline: error: the temporary Prefect server exited during the run (see "
                f"{server.log_path}); what was published is kept: rerun the same command to "
                "resume\n")  # fmt: skip
            shutdown.hard_exit(1)

        threading.Thread(target=watchdog, name="embedline-server-watchdog", daemon=True).start()

    def wait_ready(self) -> None:
        """Block until the API answers.

        :raises PrefectApiError: the temporary server did not start.
        """
        if self.server is None:
            return
        from cli.local_server import ServerStartError

        timeout_s = float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
        try:
            self.server.wait_ready(timeout_s)
        except ServerStartError as exc:
            raise PrefectApiError(str(exc)) from None

    def close(self) -> None:
        """Send Prefect's pending logs and events, then stop the temporary server, if this
        run started one (stopping it first printed "Error logging to API" at exit)."""
        self._closing = True
        if self.server is not None:
            _drain_prefect_workers()
            self.server.stop()

    def kill(self) -> None:
        """Stop the temporary server at once (a hard exit)."""
        self._closing = True
        if self.server is not None:
            self.server.kill()


def prefect_api() -> PrefectApi:
    """Pick the Prefect API for this run and export it as ``PREFECT_API_URL``.

    Call before Prefect is imported. The temporary server is spawned at once (its start-up,
    about 5 s, overlaps with the imports and the planning); call ``wait_ready`` before the
    flow.

    :raises PrefectApiError: a configured ``PREFECT_API_URL`` does not answer.
    """
    configure_prefect_environment()
    configured = os.environ.get("PREFECT_API_URL") or _profile_api_url()
    if configured:
        _check_reachable(configured)
        return PrefectApi(configured, None)
    from cli.local_server import LocalServer

    server = LocalServer().start()
    # Before Prefect is imported: its settings are read once, at import.
    os.environ["PREFECT_API_URL"] = server.api_url
    return PrefectApi(server.api_url, server)


def _profile_api_url() -> str | None:
    """``PREFECT_API_URL`` from the active Prefect profile (``prefect config set``), read
    without importing Prefect: ``$PREFECT_PROFILES_PATH``, else ``$PREFECT_HOME/profiles.toml``;
    profile ``$PREFECT_PROFILE``, else the file's ``active``."""
    import tomllib
    from pathlib import Path

    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    name = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    value = profiles.get("profiles", {}).get(name, {}).get("PREFECT_API_URL")
    return str(value) if value else None


def _drain_prefect_workers(timeout_s: float = 5.0) -> None:
    """Flush Prefect's log and event workers (background threads posting to the API)."""
    if "prefect.logging.handlers" not in sys.modules:
        return  # Prefect never ran in this process
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=timeout_s)
    EventsWorker.drain_all(timeout=timeout_s)


def _check_reachable(url: str) -> None:
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=_CHECK_TIMEOUT_S)
    except httpx.TransportError as exc:  # an HTTP answer of any status: someone is there
        raise PrefectApiError(
            f"the Prefect API at {url} (PREFECT_API_URL) does not answer ({type(exc).__name__}): "
            "start that server (`prefect server start`), or unset PREFECT_API_URL to use a "
            "temporary one") from None  # fmt: skip
