"""Whether a Dask scheduler given by address can run a run's chunks, asked before anything
else: a malformed address, a host that does not resolve, a Prefect API the workers cannot
reach (Prefect sends its URL with every task), nothing or something other than a Dask
scheduler listening there. Each is one line, in seconds, instead of every chunk failing on
the workers with a traceback (or Dask's 30 s connect timeout and 191 lines of it). The CLI
asks before Prefect starts (``cli.dask_checks``); a deployment's flow run as it starts
(``flows.embed_csv``)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from embedline.reachable import prefect_api_problem

__all__ = ["SCHEDULER_TIMEOUT_S", "dask_address_problem", "dask_identity", "scheduler_host_port"]

#: Seconds to wait for the scheduler's TCP connect (a host that drops packets answers never).
SCHEDULER_TIMEOUT_S = 5.0

#: Address schemes of Dask's TCP-based comms (distributed.comm: tcp, tls, ws, wss).
_TCP_SCHEMES = ("tcp", "tls", "ws", "wss")


def dask_identity(address: str, timeout_s: float) -> None:
    """Ask what listens at ``address`` for its Dask identity (the ``identity`` call every
    Dask server answers), within ``timeout_s`` seconds.

    :raises ValueError: a Dask server that is not a scheduler answered.
    :raises Exception: whatever the exchange raised (``TimeoutError``: something that is not
        Dask, an HTTP server say, accepted the connection and never answered).
    """
    import asyncio

    from distributed.core import rpc

    async def ask() -> Any:
        server = rpc(address, timeout=timeout_s)  # type: ignore[no-untyped-call]
        try:
            return await asyncio.wait_for(server.identity(), timeout_s)
        finally:
            await server.close_rpc()  # type: ignore[no-untyped-call]

    info = asyncio.run(ask())
    kind = info.get("type") if isinstance(info, dict) else type(info).__name__
    if kind != "Scheduler":
        raise ValueError(f"a Dask {kind} answers there, not a scheduler")


def dask_address_problem(
    address: str,
    api_url: str | None,
    *,
    option: str = "--dask-address",
    connect: Callable[..., Any] = socket.create_connection,
    resolve: Callable[..., Any] = socket.getaddrinfo,
    identify: Callable[[str, float], None] = dask_identity,
    timeout_s: float = SCHEDULER_TIMEOUT_S,
) -> str | None:
    """One line (naming ``option``, the setting that holds ``address``) when the cluster at
    ``address`` cannot run this run's chunks, else None, the first of: its address is
    malformed, or names a host that does not resolve (``resolve``: a typo, fixed first);
    ``api_url`` (the configured ``PREFECT_API_URL``; None: the CLI's temporary server) is
    one its workers cannot reach (``prefect_api_problem``); no scheduler answers there
    within ``timeout_s`` seconds (the TCP connect, then Dask's ``identity``: another server
    on the port hung the run, or failed it with a traceback)."""
    try:
        host, port = scheduler_host_port(address)
    except ValueError as exc:
        return f"{option} {address!r}: {exc}"
    try:
        resolve(host, port)
    except socket.gaierror:  # a typo to fix before anything else is judged
        return (
            f"{option} {address}: no Dask scheduler reached (host {host!r} not found); "
            "fix the address"
        )
    problem = prefect_api_problem(api_url, scheduler_host=host)
    if problem:
        return f"{option} {address}: {problem}"
    try:
        connect((host, port), timeout=timeout_s).close()
    except TimeoutError:
        why = f"no answer in {timeout_s:g} s"
    except socket.gaierror:
        why = f"host {host!r} not found"
    except OSError as exc:
        why = exc.strerror.lower() if exc.strerror else type(exc).__name__
    else:
        refused = _not_a_scheduler(address, identify, timeout_s)
        if refused is None:
            return None
        why = refused
    return f"{option} {address}: no Dask scheduler reached ({why}); start it or fix the address"


def _not_a_scheduler(
    address: str, identify: Callable[[str, float], None], timeout_s: float
) -> str | None:
    """Why what accepted the connection at ``address`` is not a Dask scheduler, or None."""
    if not address.strip().startswith(("tcp://", "ws://")) and "://" in address:
        return None  # tls:// and wss:// need the cluster's security settings to talk
    try:
        identify(address, timeout_s)
    except TimeoutError:
        return f"something accepted the connection but gave no Dask answer in {timeout_s:g} s"
    except ValueError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure to talk Dask is the same answer
        return f"something answered that is not Dask ({type(exc).__name__})"
    return None


def scheduler_host_port(address: str) -> tuple[str, int]:
    """The host and port of a Dask scheduler address (``tcp://HOST:PORT``, ``tls://…``,
    ``[::1]:8786``; no scheme is ``tcp``, as Dask reads it).

    :raises ValueError: not such an address (another scheme, no host, no port).
    """
    text = address.strip()
    parts = urlsplit(text if "://" in text else f"tcp://{text}")
    expected = "expected tcp://HOST:PORT (e.g. tcp://scheduler:8786)"
    if parts.scheme not in _TCP_SCHEMES:
        raise ValueError(f"{expected}, or tls://, ws://, wss://")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(expected)
    return parts.hostname, port
