"""Serve the deployments of ``prefect.yaml`` from this one process: no work pool, no worker.

    .venv/bin/python deployments/serve.py      # Ctrl-C to stop (schedules are paused on exit)

Creates one deployment per entry of ``prefect.yaml`` on the Prefect server in
``PREFECT_API_URL``, each with the flow of its own ``entrypoint`` and reading its parameters
and schedule from the file (one source of truth): ``embed-csv/nightly-served`` (its cron
schedule; an overlapping run is cancelled, CANCEL_NEW), ``embed-csv/manual-served`` (no
schedule, for runs started from the UI or with
``prefect deployment run 'embed-csv/manual-served' --param ...``; an overlapping run waits,
ENQUEUE) and ``gc-output/gc-weekly-served`` (retention, its schedule inactive until switched
on). Each flow run is a child process of this one, started in the repository root, so
relative parameters resolve inside this checkout; ``limit=1`` runs one flow run at a time
across both deployments. If no API key is in the environment, the key is copied from the
``Secret`` block ``embedline-api-key`` (or ``$EMBEDLINE_API_KEY_BLOCK``), when it exists,
into this process's environment, which flow runs inherit (``flows/api_key.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SUFFIX = "-served"  # beside, not over, the worker deployments of prefect.yaml


def _spec() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text()))


def build_deployments() -> list[Any]:
    """Return a ``RunnerDeployment`` per deployment of ``prefect.yaml``, named ``<name>-served``,
    of the flow its ``entrypoint`` names: the server checks each deployment's parameters
    against that flow's signature."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.events import DeploymentEventTrigger
    from prefect.flows import Flow, load_flow_from_entrypoint
    from prefect.schedules import Cron

    deployments = []
    for spec in _spec()["deployments"]:
        entrypoint = str(spec["entrypoint"])  # a file in the checkout, or a module's flow
        flow: Flow[..., Any] = load_flow_from_entrypoint(
            str(REPO / entrypoint) if ":" in entrypoint else entrypoint
        )
        limit = spec["concurrency_limit"]
        schedules = [
            Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True))
            for s in spec.get("schedules") or []
        ]
        deployments.append(
            flow.to_deployment(
                name=spec["name"] + SUFFIX,
                description=spec.get("description"),
                tags=spec.get("tags"),
                parameters=spec["parameters"],
                schedules=schedules,
                concurrency_limit=ConcurrencyLimitConfig(
                    limit=limit["limit"],
                    collision_strategy=ConcurrencyLimitStrategy(limit["collision_strategy"]),
                ),
                triggers=[
                    DeploymentEventTrigger.model_validate(t) for t in spec.get("triggers") or []
                ],
            )
        )
    return deployments


def main() -> None:
    """Serve until interrupted."""
    os.chdir(REPO)  # flow runs start here: relative parameters and the entrypoint resolve
    sys.path.insert(0, str(REPO))  # `flows`, `tasks`, … without an installed package
    # the adapters' "embedline.*" log lines (HTTP status, attempts) go to the run logs, and
    # the local model never reaches for a hub; set before Prefect configures logging
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "embedline")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from prefect import serve

    from flows.api_key import export_api_key_from_block

    export_api_key_from_block()
    serve(*build_deployments(), limit=1)


if __name__ == "__main__":
    main()
