"""Whether a Dask cluster's workers can reach the run's Prefect API: Prefect sends the flow's
``PREFECT_API_URL`` with every task, and a worker on another machine cannot reach this
machine's loopback. Pure: names are compared, nothing is resolved or connected. Used by the
CLI before Prefect starts (``cli.dask_checks``) and by the flow as it starts
(``flows.embed_csv``: a deployment's flow run, which no CLI checked)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["is_loopback", "prefect_api_problem"]

_SET_API = (
    "set PREFECT_API_URL to a Prefect server the cluster's workers can reach (for a "
    "deployment's flow run, in the environment of the work pool's worker that runs it)"
)


def prefect_api_problem(api_url: str | None, *, scheduler_host: str) -> str | None:
    """Why the workers of the scheduler at ``scheduler_host`` cannot reach the Prefect API
    ``api_url``, or None.

    None (the CLI's temporary server, which listens on this machine's loopback and stops
    with the command) always; a loopback URL (127.0.0.0/8, ::1, ``localhost``) unless the
    scheduler is on this machine's loopback too (its workers then run here).
    """
    if not api_url:
        return (
            "with no PREFECT_API_URL this run's temporary Prefect server listens on this "
            f"machine's loopback, which the cluster's workers cannot reach: {_SET_API}"
        )
    host = urlsplit(api_url).hostname or ""
    if is_loopback(host) and not is_loopback(scheduler_host):
        return (
            f"PREFECT_API_URL is on loopback ({host}), which the cluster's workers cannot "
            f"reach: {_SET_API}"
        )
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback: 127.0.0.0/8, ::1 (also IPv4-mapped),
    ``localhost`` and its subdomains (RFC 6761 §6.3). Resolves nothing."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
