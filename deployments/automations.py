"""Apply the alerts of ``deployments/automations.yaml`` to the Prefect server at PREFECT_API_URL.

    .venv/bin/python deployments/automations.py --webhook-url URL   # first time: makes the block
    .venv/bin/python deployments/automations.py                     # after editing the file

Deploy first (``prefect deploy --all``): the alerts match the deployment's id. Each
automation of the file is created, replacing any of the same name (applying twice leaves one
of each). The placeholders ``$DEPLOYMENT`` (``prefect.deployment.<id>``), ``$BLOCK`` (the
notification block's document id), ``$LATE_WITHIN`` (seconds: ``success_every`` +
``grace``) and ``$LATE_WITHIN_TEXT`` are filled in; ``dead_letters_threshold`` is stored
as the Prefect Variable ``embedline_dead_letters_alert_threshold`` that a committing run
reads (``flows/events.py``). The webhook URL may hold a token: it is stored in the block
only, never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from flows.events import THRESHOLD_VARIABLE  # noqa: E402
from tasks.gc.retention import parse_age  # noqa: E402

__all__ = ["apply", "automation_specs"]

DEFAULT_FILE = REPO / "deployments" / "automations.yaml"


def automation_specs(
    config: dict[str, Any], *, deployment_id: str, block_id: str
) -> list[dict[str, Any]]:
    """The file's automations with the placeholders filled in, as JSON-ready dicts in
    Prefect's ``AutomationCore`` shape.

    :raises ValueError: ``success_every`` or ``grace`` is not a duration (``90s``, ``2h``,
        ``1d``), or the late window is under Prefect's 10 s minimum for proactive triggers.
    """
    within = parse_age(str(config["success_every"])) + parse_age(str(config["grace"]))
    if within < 10:
        raise ValueError(
            "success_every + grace must be at least 10 s (Prefect's minimum "
            "for a proactive trigger)"
        )
    values = {
        "$DEPLOYMENT": f"prefect.deployment.{deployment_id}",
        "$BLOCK": block_id,
        "$LATE_WITHIN_TEXT": _shown(within),
    }

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: fill(value) for key, value in node.items()}
        if isinstance(node, list):
            return [fill(value) for value in node]
        if node == "$LATE_WITHIN":
            return within
        if isinstance(node, str):
            for name, value in values.items():
                node = node.replace(name, value)
        return node

    return [fill(spec) for spec in config["automations"]]


def _shown(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def apply(config: dict[str, Any], *, webhook_url: str | None = None) -> list[str]:
    """Make the file's alerts exist on the server: the block (from ``webhook_url`` when
    given), the threshold Variable, and each automation (replaced by name). Returns the
    automations' names.

    :raises LookupError: the deployment or the notification block does not exist.
    """
    from prefect import get_client
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.events.schemas.automations import AutomationCore
    from prefect.exceptions import ObjectNotFound
    from prefect.variables import Variable

    slug = str(config["notify_block"])  # BLOCK-TYPE/NAME, as `prefect block ls` shows it
    if webhook_url:
        name = slug.rpartition("/")[2]
        CustomWebhookNotificationBlock(  # type: ignore[call-arg]  # headers, cookies: optional
            name=name,
            url=webhook_url,
            json_data={"text": "{{subject}}\n{{body}}", "title": "{{name}}"},
        ).save(name, overwrite=True)
        slug = f"{CustomWebhookNotificationBlock.get_block_type_slug()}/{name}"
    block_type, _, block_name = slug.partition("/")
    with get_client(sync_client=True) as client:
        block_id = None
        if block_type and block_name:
            with contextlib.suppress(ObjectNotFound):  # its id, through the public API
                block_id = client.read_block_document_by_name(
                    block_name, block_type, include_secrets=False
                ).id
        if block_id is None:
            raise LookupError(
                f"no notification block {slug!r} (BLOCK-TYPE/NAME): pass "
                "--webhook-url URL to create a webhook block, or create one in "
                "the UI"
            )
        Variable.set(THRESHOLD_VARIABLE, int(config["dead_letters_threshold"]), overwrite=True)
        try:
            deployment = client.read_deployment_by_name(str(config["deployment"]))
        except Exception as exc:  # ObjectNotFound
            raise LookupError(
                f"no deployment {config['deployment']!r} on the server: run "
                "prefect deploy --all first (deployments/README.md)"
            ) from exc
        names = []
        for spec in automation_specs(
            config, deployment_id=str(deployment.id), block_id=str(block_id)
        ):
            for old in client.read_automations_by_name(spec["name"]):
                client.delete_automation(old.id)
            client.create_automation(AutomationCore.model_validate(spec))
            names.append(spec["name"])
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--file`` and ``--webhook-url``, apply, print one line per automation."""
    parser = argparse.ArgumentParser(description="Apply embedline's alerts to Prefect.")
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE)
    parser.add_argument(
        "--webhook-url",
        default=None,
        help="create (or replace) the notification block as a webhook to URL",
    )
    args = parser.parse_args(argv)
    try:
        config = yaml.safe_load(args.file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        sys.stderr.write(f"automations: error: cannot read {args.file}: {exc}\n")
        return 2
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:  # else Prefect's client starts a throwaway server and applies them there
        sys.stderr.write(
            "automations: error: PREFECT_API_URL is not set: point it at the "
            "server the deployments are on (deployments/README.md, step 2)\n"
        )
        return 2
    try:
        names = apply(config, webhook_url=args.webhook_url)
    except (LookupError, ValueError) as exc:
        sys.stderr.write(f"automations: error: {exc}\n")
        return 2
    except Exception as exc:  # httpx/Prefect: the server does not answer
        if "Connect" not in type(exc).__name__ and "Timeout" not in type(exc).__name__:
            raise
        sys.stderr.write(
            f"automations: error: the Prefect API at {api} does not answer "
            f"({type(exc).__name__}): start the server or fix PREFECT_API_URL\n"
        )
        return 1
    for name in names:
        print(f"automation applied: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
