"""``run --dask-address``'s checks before Prefect starts (``cli.dask_checks``): a Prefect API
the workers cannot reach, a malformed address and a scheduler that does not answer are one
line, exit 2. No socket is opened: the connect is injected."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from cli.dask_checks import check_dask_address
from embedline.reachable import is_loopback
from flows.dask_address import scheduler_host_port

REMOTE_API = "http://prefect.internal:4200/api"


class _Conn:
    def close(self) -> None:
        pass


def _answers(address: tuple[str, int], timeout: float) -> _Conn:
    return _Conn()


def _raising(exc: BaseException) -> Any:
    def connect(address: tuple[str, int], timeout: float) -> _Conn:
        raise exc

    return connect


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "[::1]",
        "localhost",
        "LOCALHOST.",
        "api.localhost",
        "::ffff:127.0.0.1",
    ],
)
def test_loopback_hosts_are_recognised(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["10.0.0.5", "192.0.2.2", "fd00::2", "prefect.internal", "localhost.example.com", ""]
)
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("tcp://10.0.0.5:8786", ("10.0.0.5", 8786)),
        ("tls://scheduler.internal:8786", ("scheduler.internal", 8786)),
        ("10.0.0.5:8786", ("10.0.0.5", 8786)),
        ("tcp://[::1]:8786", ("::1", 8786)),
    ],
)
def test_scheduler_addresses_are_parsed(address: str, expected: tuple[str, int]) -> None:
    assert scheduler_host_port(address) == expected


@pytest.mark.parametrize(
    "address",
    [
        "tcp://scheduler",
        "tcp://:8786",
        "tcp://host:port",
        "tcp://host:99999",
        "http://host:8786",
        "ucx://host:8786",
        "tcp://host:8786/path",
        "scheduler",
    ],
)
def test_a_malformed_address_is_exit_2_in_one_line(address: str) -> None:
    message, code = check_dask_address(address, REMOTE_API, connect=_answers)
    assert code == 2
    assert "expected tcp://HOST:PORT" in message and "\n" not in message


def test_no_prefect_api_url_is_refused_naming_what_to_set() -> None:
    message, code = check_dask_address(
        "tcp://10.0.0.5:8786", None, connect=_answers, identify=_a_scheduler
    )
    assert code == 2
    assert "temporary Prefect server" in message
    assert "set PREFECT_API_URL to a Prefect server the cluster's workers can reach" in message


def test_no_prefect_api_url_is_refused_with_a_scheduler_on_loopback_too() -> None:
    assert check_dask_address("tcp://127.0.0.1:8786", None, connect=_answers) is not None


@pytest.mark.parametrize(
    "api_url",
    ["http://127.0.0.1:4200/api", "http://localhost:4200/api", "http://[::1]:4200/api"],
)
def test_a_loopback_prefect_api_is_refused_for_a_remote_scheduler(api_url: str) -> None:
    message, code = check_dask_address(
        "tcp://10.0.0.5:8786", api_url, connect=_answers, identify=_a_scheduler
    )
    assert code == 2
    assert "PREFECT_API_URL is on loopback" in message


def test_an_unknown_host_is_named_before_the_prefect_api_is_judged() -> None:
    """It read "PREFECT_API_URL is on loopback": fixed, the address still failed."""

    def unknown(host: str, port: int) -> list[Any]:
        raise socket.gaierror(-2, "Name or service not known")

    message, code = check_dask_address(
        "tcp://no-such-host.invalid:8786", "http://127.0.0.1:4200/api", resolve=unknown
    )
    assert code == 2
    assert "host 'no-such-host.invalid' not found" in message, message


def test_a_loopback_prefect_api_serves_a_scheduler_on_loopback() -> None:
    """Workers that reach their scheduler on this machine's loopback run on this machine."""
    assert (
        check_dask_address(
            "tcp://localhost:8786",
            "http://127.0.0.1:4200/api",
            connect=_answers,
            identify=_a_scheduler,
        )
        is None
    )


def test_a_reachable_scheduler_and_api_pass() -> None:
    seen: list[tuple[tuple[str, int], float]] = []

    def connect(address: tuple[str, int], timeout: float) -> _Conn:
        seen.append((address, timeout))
        return _Conn()

    assert (
        check_dask_address(
            "tcp://10.0.0.5:8786", REMOTE_API, connect=connect, identify=_a_scheduler
        )
        is None
    )
    assert seen == [(("10.0.0.5", 8786), 5.0)]


def _a_scheduler(address: str, timeout_s: float) -> None:
    """A Dask scheduler's identity: nothing to say."""


@pytest.mark.parametrize(
    ("exc", "why"),
    [
        (TimeoutError(), "gave no Dask answer in 5 s"),
        (ValueError("a Dask Worker answers there, not a scheduler"), "not a scheduler"),
        (MemoryError("Unable to allocate 3.07 EiB"), "not Dask (MemoryError)"),
    ],
)
def test_a_port_where_something_else_answers_is_exit_2_in_one_line(
    exc: BaseException, why: str
) -> None:
    """An HTTP server on the port hung the run; a stray frame made Dask allocate exabytes."""

    def identify(address: str, timeout_s: float) -> None:
        raise exc

    message, code = check_dask_address(
        "tcp://10.0.0.5:8786", REMOTE_API, connect=_answers, identify=identify
    )
    assert code == 2 and "no Dask scheduler reached" in message and why in message


@pytest.mark.parametrize(
    ("exc", "why"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
        (TimeoutError("timed out"), "no answer in 5 s"),
        (__import__("socket").gaierror(-2, "Name or service not known"), "not found"),
    ],
)
def test_an_unreachable_scheduler_is_exit_2_in_one_line(exc: BaseException, why: str) -> None:
    message, code = check_dask_address("tcp://10.0.0.5:8786", REMOTE_API, connect=_raising(exc))
    assert code == 2
    assert "no Dask scheduler reached" in message and why in message
    assert "\n" not in message
