"""The Prefect environment of a CLI run: quiet offline defaults, which API server to use, and
``with_prefect_api``, which runs a command's body against it.

With ``PREFECT_API_URL`` set (environment or Prefect profile), that server must answer before
anything starts; without it the CLI starts its own temporary server (``cli.local_server``)
and exports its URL, so the flow, its tasks and Dask workers all talk to that one server.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cli.failures import EXIT_USAGE, exit_on_api_loss, fail
from cli.prefect_console import quiet_prefect_console
from embedline.shutdown import STOP
from embedline.stop_report import ApiLoss

if TYPE_CHECKING:
    from cli.local_server import LocalServer

__all__ = [
    "HealthProbe",
    "PrefectApiError",
    "configure_prefect_environment",
    "configured_api_url",
    "invalid_prefect_setting",
    "is_prefect_cloud",
    "prefect_api",
    "reread_prefect_settings",
    "temporary_server_stopped",
    "with_prefect_api",
]

_PREFECT_DEFAULTS = {
    # A temporary Prefect server can take longer than Prefect's 20 s default to start on a
    # loaded 2-core machine; with no network, telemetry only fails, so it is off.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # Adapters log to "embedline.*" (they never call Prefect): route those into run logs.
    "PREFECT_LOGGING_EXTRA_LOGGERS": "embedline",
    # ...and outside a flow run (the CLI before Prefect: a commit, a night of copied rows,
    # its graceful stop) they have none to go to, and Prefect's API handler would print a
    # UserWarning with its source line for each.
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}
_CHECK_TIMEOUT_S = 5.0  # seconds to wait for a configured server's /health
#: A configured server whose port refuses connections this long (two probes or more) is
#: gone; a restart of ``prefect server start`` takes longer anyway (8-16 s measured).
API_REFUSED_AFTER_S = 2.0
#: A server whose connects or answers time out this long counts as gone too (a host that
#: is down, a hung process): slower, because a loaded server can be slow to answer.
API_SILENT_AFTER_S = 30.0
_PROBE_TIMEOUT = (1.0, 2.0)  # seconds: connect, read of one /health probe


class PrefectApiError(RuntimeError):
    """No usable Prefect API: the message is one line that says what to do (exit 2)."""


def configure_prefect_environment() -> None:
    """Set embedline's Prefect defaults in ``os.environ`` where the user set nothing."""
    for name, value in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)


def reread_prefect_settings() -> None:
    """Have Prefect read the settings just exported, if this process imported it already.

    Prefect reads its settings and configures its logging when it is imported; the CLI
    exports its own (``configure_prefect_environment``, the temporary server's URL) before
    that. A process that imported Prefect first (a fork server that preloads it, a notebook
    that calls the CLI) would run on the settings of that import: Prefect's settings context
    is refreshed (``prefect.context.refresh_global_settings_context``, as Prefect does after
    its plugins set variables) and, where what its logging is made of changed
    (``_logging_unchanged``), its logging configured again, without the handlers the first
    configuration gave the extra loggers (else each line would print twice).

    :raises pydantic.ValidationError: a Prefect setting Prefect refuses
        (``invalid_prefect_setting`` words it).
    """
    if "prefect.context" not in sys.modules:
        return  # Prefect reads them when it is imported
    import logging

    from prefect.context import refresh_global_settings_context
    from prefect.logging.configuration import setup_logging
    from prefect.settings import get_current_settings

    before = get_current_settings()
    refresh_global_settings_context()
    if _logging_unchanged(before, get_current_settings()):
        return
    given = logging.getLogger("prefect.extra").handlers
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger.name != "prefect.extra":
            for handler in [h for h in logger.handlers if h in given]:
                logger.removeHandler(handler)
    setup_logging(incremental=False)


def _logging_unchanged(before: Any, after: Any) -> bool:
    """Whether Prefect's logging configuration under settings ``after`` is the one made under
    ``before``: ``setup_logging`` takes the logging settings, the server's and the internal
    loggers' levels and, beyond the settings, ``PREFECT_LOGGING_*`` variables that override
    a key of its configuration file (any such variable: not known unchanged), and the
    configuration file itself where one exists."""

    def made_of(settings: Any) -> tuple[str, ...]:
        levels = (settings.server.logging_level, settings.internal.logging_level)
        chosen = settings.logging.model_dump(mode="json")
        path = settings.logging.config_path  # read only where it exists, else Prefect's own
        chosen["config_path"] = str(path) if path is not None and path.exists() else ""
        return json.dumps(chosen, sort_keys=True), *map(str, levels)

    named = after.logging.to_environment_variables(include_aliases=True)
    overrides = [k for k in os.environ if k.startswith("PREFECT_LOGGING_") and k not in named]
    return not overrides and made_of(before) == made_of(after)


def is_prefect_cloud(url: str) -> bool:
    """Whether ``url`` (a ``PREFECT_API_URL``) is Prefect Cloud's API (``*.prefect.cloud``)."""
    return (urlsplit(url).hostname or "").endswith("prefect.cloud")


def invalid_prefect_setting(exc: BaseException) -> str | None:
    """One line for a Prefect setting that Prefect's own settings model refuses (raised by
    ``import prefect``, a settings read or ``reread_prefect_settings``: a
    ``pydantic.ValidationError`` from ``prefect/settings`` or Prefect's root settings
    context), naming the variables that set it; None for any other error.

    Only each error's location and message are shown, never the value (it may be a key).
    """
    import traceback

    from pydantic import ValidationError

    if not isinstance(exc, ValidationError) or not any(
        "/prefect/settings/" in frame.filename.replace(os.sep, "/")
        or frame.name == "root_settings_context"
        for frame in traceback.extract_tb(exc.__traceback__)
    ):
        return None
    problems, names = [], []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        problems.append(f"{field}: {error['msg']}")
        tail = "_" + str(error["loc"][-1]).upper() if error["loc"] else "\0"
        names += sorted(n for n in os.environ if n.startswith("PREFECT_") and n.endswith(tail))
    where = (
        ", ".join(dict.fromkeys(names))
        or "a Prefect profile (`prefect config view`) or prefect.toml"
    )
    return (
        f"Prefect refuses a setting ({exc.title} {'; '.join(problems)}), set by {where}: "
        "fix or unset it"
    )


def drop_prefect_settings_errors(record: Any) -> bool:
    """A ``logging`` filter for Prefect's "prefect.plugins" logger: drop its report of a
    refused setting at import ("Failed to initialize plugins: …", four lines with the
    value), which the CLI reports itself in one line (``invalid_prefect_setting``)."""
    exc = record.exc_info[1] if record.exc_info else None
    return exc is None or invalid_prefect_setting(exc) is None


#: Prefect's background senders, whose drain at exit says how much is left to send.
EXIT_DRAIN_LOGGERS = ("EventsWorker", "APILogWorker")


def drop_drain_progress(record: Any) -> bool:
    """A ``logging`` filter for ``EXIT_DRAIN_LOGGERS``: drop "Still processing items: N
    items remaining..." (``prefect/_internal/concurrency/services.py``), which a command
    that emits an event just before it ends prints as a WARNING, the event sent all
    the same (a night of copied rows committed without a flow, every time)."""
    return not str(record.msg).startswith("Still processing items")


class PrefectApi:
    """The API this run uses: a configured server, or the CLI's temporary ``server``."""

    def __init__(self, url: str, server: LocalServer | None) -> None:
        self.url = url
        self.server = server
        self._closing = False
        self._unusable: str | None = None  # why the temporary server could not start

    def watch(self, on_lost: Callable[[ApiLoss], None], poll_s: float = 0.5) -> None:
        """Call ``on_lost`` (in a watchdog thread) if the API goes away before ``close``:
        the temporary server's process exits, or a configured server refuses connections
        for ``API_REFUSED_AFTER_S`` seconds (or answers nothing for ``API_SILENT_AFTER_S``).
        Without it, every Prefect call of the flow retries for about a minute
        (``PREFECT_CLIENT_MAX_RETRIES`` = 5: 2+4+8+16+32 s) and the CLI ends minutes later
        with a traceback."""
        import threading
        import time

        health = None if self.server is not None else HealthProbe(self.url)
        probe: Callable[[], ApiLoss | None] = self._server_exited if health is None else health.lost

        def watchdog() -> None:
            try:
                while not self._closing:
                    loss = probe()
                    if loss is not None:
                        if not self._closing:
                            on_lost(loss)
                        return
                    time.sleep(poll_s)
            finally:
                if health is not None:
                    health.close()

        threading.Thread(target=watchdog, name="embedline-api-watchdog", daemon=True).start()

    def start_server(self) -> None:
        """Spawn the temporary server if it is not started yet (``prefect_api(defer_server=
        True)``; call from the main thread, as ``LocalServer.start``). A ``PREFECT_HOME``
        that cannot be written is raised by ``wait_ready``, when a flow needs the server."""
        if self.server is not None and not self.server.started and self._unusable is None:
            try:
                self.server.start()
            except OSError as exc:
                self._unusable = (
                    f"cannot start the temporary Prefect server: {exc.strerror} "
                    f"({exc.filename}): set PREFECT_HOME to a directory you can write, or "
                    "PREFECT_API_URL to a running Prefect server"
                )

    def _server_exited(self) -> ApiLoss | None:
        server = self.server
        # A server that exits before it ever answered did not start: ``wait_ready`` says so,
        # unless the reason (a Prefect setting Prefect refuses) stops the run first, exit 2.
        if server is None or not server.ready or server.alive():
            return None
        return ApiLoss(
            f"the temporary Prefect server exited during the run (see {server.log_path})",
            "rerun the same command to resume",
        )

    def wait_ready(self) -> None:
        """Block until the API answers.

        :raises PrefectApiError: the temporary server did not start.
        """
        if self.server is None:
            return
        from cli.local_server import ServerStartError

        self.start_server()
        if self._unusable is not None:
            raise PrefectApiError(self._unusable)
        timeout_s = float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
        try:
            self.server.wait_ready(timeout_s)
        except ServerStartError as exc:
            raise PrefectApiError(str(exc)) from None

    def close(self) -> None:
        """Send Prefect's pending logs and events, then stop the temporary server, if this
        run started one (stopping it first would print "Error logging to API" at exit). An
        interrupt during the sending still stops the server."""
        self._closing = True
        if self.server is not None:
            global _temporary_server_stopped
            _temporary_server_stopped = self.server.started
            try:
                _drain_prefect_workers()
            finally:
                self.server.stop()

    def kill(self) -> None:
        """Stop the temporary server at once (a hard exit)."""
        self._closing = True
        if self.server is not None:
            global _temporary_server_stopped
            _temporary_server_stopped = self.server.started
            self.server.kill()


#: True once this process stopped the temporary server it started: Prefect's own exit-time
#: sending of logs and events can then reach nothing.
_temporary_server_stopped = False


def temporary_server_stopped() -> bool:
    """True once this process stopped (or killed) the temporary Prefect server it started.
    Prefect's log and event workers then have nowhere to send what is left in their queues;
    at interpreter exit they would retry it (seconds, up to a minute: a Ctrl-C that lands
    while they are being flushed leaves items behind)."""
    return _temporary_server_stopped


def prefect_api(*, defer_server: bool = False) -> PrefectApi:
    """Pick the Prefect API for this run and export it as ``PREFECT_API_URL``.

    Call before Prefect is imported. The temporary server is spawned at once (its start-up,
    about 5 s, overlaps with the imports and the planning), unless ``defer_server``: then
    by ``start_server`` or ``wait_ready``, when a flow is to run (its URL is fixed now);
    call ``wait_ready`` before the flow.

    :raises PrefectApiError: a configured ``PREFECT_API_URL`` does not answer.
    """
    configure_prefect_environment()
    configured = configured_api_url()
    if configured:
        _check_reachable(configured)
        reread_prefect_settings()
        return PrefectApi(configured, None)
    from cli.local_server import LocalServer

    server = LocalServer()
    # Before Prefect is imported: its settings are read once, at import.
    os.environ["PREFECT_API_URL"] = server.api_url
    reread_prefect_settings()
    api = PrefectApi(server.api_url, server)
    if not defer_server:
        api.start_server()
    return api


def with_prefect_api(
    body: Callable[[PrefectApi], int],
    *,
    on_lost: Callable[[ApiLoss], None] | None = None,
    defer_server: bool = False,
) -> int:
    """Pick the Prefect API (a temporary server starts now, in the background, or when
    needed with ``defer_server``: ``prefect_api``), call ``body(api)`` and stop that server
    however ``body`` ends, a hard exit included.
    Returns ``body``'s exit code, or 2 with one line when no API is usable.

    If the API goes away while ``body`` runs, ``on_lost(loss)`` is called in a watchdog
    thread (an ``embedline.stop_report.ApiLoss``); by default it prints one line and exits 1.
    """
    try:
        api = prefect_api(defer_server=defer_server)
    except PrefectApiError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    STOP.exit.on_hard_exit(api.kill)
    STOP.on_first_interrupt(quiet_prefect_console)
    api.watch(on_lost or exit_on_api_loss)
    try:
        return body(api)
    finally:
        api.close()


def configured_api_url() -> str | None:
    """The Prefect API a user configured (``PREFECT_API_URL``, else the active profile's),
    read without importing Prefect; None: the run gets a temporary server."""
    return os.environ.get("PREFECT_API_URL") or _profile_api_url()


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
    """``GET {url}/health`` once. Nothing answering, a 404/405, a web page (HTML) or a 200
    that is not Prefect's ``true`` is refused; any other answer (200 ``true``, 401/403 from
    a server that wants a key, a 5xx) lets Prefect's client take over.

    :raises PrefectApiError: one line that names the URL and what to do (exit 2).
    """
    import httpx

    try:
        response = httpx.get(f"{url.rstrip('/')}/health", timeout=_CHECK_TIMEOUT_S)
    except httpx.TransportError as exc:
        raise PrefectApiError(
            f"the Prefect API at {url} (PREFECT_API_URL) does not answer ({type(exc).__name__}): "
            "start that server (`prefect server start`), or unset PREFECT_API_URL to use a "
            "temporary one"
        ) from None
    what = _not_a_prefect_api(url, response)
    if what:
        # else Prefect's client fails with tracebacks ("Failed to reach API", "Invalid
        # version") and exit 1
        raise PrefectApiError(
            f"the server at {url} (PREFECT_API_URL) answers, but not as a Prefect API (HTTP "
            f"{response.status_code}{what} for /health): set PREFECT_API_URL to the server's "
            "API URL, which ends in /api (e.g. http://127.0.0.1:4200/api), or unset it to use "
            "a temporary server"
        )


def _not_a_prefect_api(url: str, response: Any) -> str | None:
    """Why ``response`` to ``GET {url}/health`` is not a Prefect API's ("" for a 404 or
    405), or None if it may be one. A Prefect server answers 200 ``true``; Prefect Cloud's
    answer is not relied on (its host is let through)."""
    content_type = response.headers.get("content-type", "").split(";")[0].strip()
    if content_type == "text/html":
        return ", a web page"
    if response.status_code in (404, 405):
        return ""
    if (
        response.status_code == 200
        and response.text.strip() != "true"
        and not is_prefect_cloud(url)
    ):
        return ", not Prefect's answer 'true'"
    return None


class HealthProbe:
    """``GET {url}/health`` once per ``lost()`` call (connect 1 s, read 2 s); ``lost()``
    returns an ``ApiLoss`` once the probes have failed for ``API_REFUSED_AFTER_S`` seconds
    (connection refused: nothing listens) or ``API_SILENT_AFTER_S`` (timeouts), else None.
    Any HTTP answer, 5xx included, means the server is there (its own clients retry those).

    One ``httpx.Client`` serves every probe: a new one per probe built an SSL context each
    time (25 ms of CPU, 5 % of a core at two probes a second, taken from the flow's GIL)."""

    def __init__(self, url: str) -> None:
        self.url = f"{url.rstrip('/')}/health"
        self._failing_since: float | None = None
        self._client: Any = None

    def lost(self) -> ApiLoss | None:
        """None while the server answers (any HTTP status: someone is there)."""
        import httpx

        if self._client is None:
            self._client = httpx.Client(
                timeout=httpx.Timeout(_PROBE_TIMEOUT[1], connect=_PROBE_TIMEOUT[0])
            )
        sent = time.monotonic()  # a timeout means silence since the probe was sent
        try:
            self._client.get(self.url)
        except httpx.TransportError as exc:
            now = time.monotonic()
            self._failing_since = self._failing_since or sent
            refused = isinstance(exc, httpx.ConnectError)  # nothing listens (not a timeout)
            limit = API_REFUSED_AFTER_S if refused else API_SILENT_AFTER_S
            if now - self._failing_since >= limit:
                return ApiLoss(
                    f"the Prefect API at {self.url.removesuffix('/health')} (PREFECT_API_URL) "
                    f"stopped answering during the run ({type(exc).__name__} for "
                    f"{now - self._failing_since:.0f} s)",
                    "restart that server and rerun the same command to resume",
                )
            return None
        self._failing_since = None
        return None

    def close(self) -> None:
        """Close the probes' connection (the watchdog calls it when it stops)."""
        if self._client is not None:
            self._client.close()
