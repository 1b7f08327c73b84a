"""Session-wide test environment: no real credentials, no real Prefect, no real AWS.

Like httpx's ``clean_environ``: variables that could reach a real account are removed before
anything imports Prefect or boto3, and Prefect gets a throwaway home.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fixtures import fake_openai  # noqa: F401
from tests.support.moto_server import moto_endpoint, s3_bucket, s3_client  # noqa: F401
from tests.support.pg_server import pg_uri  # noqa: F401
from tests.support.pgbouncer_server import pgbouncer_uri  # noqa: F401
from tests.support.prefect_server import prefect_api_url  # noqa: F401
from tests.support.s3_servers import (  # noqa: F401
    conditional_s3_endpoint,
    ministack_endpoint,
    s3rver_server,
)
from tests.support.tmpfs import tiny_tmpfs  # noqa: F401

_SECRETS = (
    "OPENAI_API_KEY",
    "EMBEDLINE_API_KEY",
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "PREFECT_API_URL",
    "PREFECT_API_KEY",
)


_prefect_home: str | None = None  # the throwaway home this process made


def pytest_configure(config: object) -> None:
    global _prefect_home
    for name in _SECRETS:
        os.environ.pop(name, None)
    _prefect_home = os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="embedline-test-prefect-")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
    os.environ["HF_HUB_OFFLINE"] = "1"
    # SIGTERM (a CI timeout, `kill`) ends the session like Ctrl-C, so session fixtures stop
    # their servers (Prefect, PostgreSQL) instead of leaving them running
    signal.signal(signal.SIGTERM, _interrupt)
    # Tests Ctrl-C the CLIs they start, as a terminal does. A non-interactive shell that ran
    # the suite in the background (`make test &`) set SIGINT to ignored, which every child
    # inherits and embedline keeps by design (`nohup`): those tests then failed.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: object) -> None:
    """Remove the throwaway home (its database grows to megabytes: one a run per process
    was left in the temp dir, 285 of them after a day of runs). Session fixtures have
    stopped their servers by now."""
    if _prefect_home is not None:
        shutil.rmtree(_prefect_home, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Show the lines passing tests recorded with ``record_property("summary", LINE)`` (how
    many random sequences a property test tried), from xdist workers too."""
    lines = [
        str(value)
        for report in terminalreporter.stats.get("passed", [])
        for name, value in getattr(report, "user_properties", ())
        if name == "summary"
    ]
    if lines:
        terminalreporter.section("summaries")
        for line in lines:
            terminalreporter.write_line(line)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(autouse=True)
def _signal_handlers_put_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves SIGINT or SIGTERM handled otherwise than it found them errors, and
    the handlers are put back: an ignored SIGINT left in this process is inherited by every
    CLI a later test starts (which keeps it ignored, as ``nohup`` asks), so a Ctrl-C test run
    after it failed on which tests an xdist worker happened to run first."""
    expected = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    left = {s: signal.getsignal(s) for s in expected}
    for signum, handler in expected.items():
        signal.signal(signum, handler)
    changed = [signal.Signals(s).name for s in expected if left[s] is not expected[s]]
    assert not changed, f"{request.node.nodeid} left {', '.join(changed)} handled otherwise"
