"""The checks of ``run --task-runner dask --dask-address ADDRESS`` (or ``--dask-cluster-class
CLASS``) before Prefect starts: the cluster's workers must reach the run's Prefect API
(Prefect sends its URL with every task), a scheduler must answer at ADDRESS
(``flows.dask_address``, which a deployment's flow run asks too), and CLASS must import
here. Each is one line and exit 2, in seconds, instead of every chunk failing on the workers
with a traceback (or a 30 s wait for the scheduler)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cli.failures import EXIT_USAGE
from embedline.reachable import prefect_api_problem
from flows.dask_address import dask_address_problem

if TYPE_CHECKING:
    from embedline.settings import RunSettings

__all__ = ["check_cluster_class", "check_dask_address"]


def check_dask_address(address: str, api_url: str | None, **probes: Any) -> tuple[str, int] | None:
    """(one-line message, exit 2) when the cluster at ``address`` cannot run this run's
    chunks (``flows.dask_address.dask_address_problem``, ``probes`` its ``connect``,
    ``resolve``, ``identify`` and ``timeout_s``), else None."""
    problem = dask_address_problem(address, api_url, **probes)
    return (problem, EXIT_USAGE) if problem else None


def check_cluster_class(settings: RunSettings, api_url: str | None) -> tuple[str, int] | None:
    """(one-line message, exit code) when the cluster ``settings.dask_cluster_class`` starts
    cannot run this run's chunks, else None: the class does not import here (where the flow
    starts it), or its workers run on other machines (every class but distributed's
    ``LocalCluster``) and cannot reach ``api_url`` (``prefect_api_problem``)."""
    from embedline.errors import InputError
    from embedline.settings import remote_dask
    from flows.dask_cluster import cluster_class

    path = settings.dask_cluster_class or ""
    if remote_dask(settings):
        problem = prefect_api_problem(api_url, scheduler_host="")
        if problem:
            return f"--dask-cluster-class {path}: {problem}", EXIT_USAGE
    try:
        cluster_class(path)
    except InputError as exc:
        return str(exc), EXIT_USAGE
    return None
