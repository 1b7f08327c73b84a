"""``embedline deployment NAME INPUT [run options]``: write a deployment of the ``embed-csv``
flow for INPUT into a ``prefect.yaml``, from the options ``embedline run`` takes.

The deployment's parameters are the options given that differ from the defaults, in the flow's
sections (``embedline.parameters``); the rest keep the defaults, which are the CLI's. A
deployment of the same name is replaced, others and the file's comments are kept; a missing
file is created with the build and pull steps of ``deployments/prefect.yaml`` (the directory
``prefect deploy`` runs from becomes the flow run's working directory, so relative paths mean
what they mean to ``embedline run`` there). No secret is written: the API key stays in the
worker's environment or a Secret block.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.arguments import HELP_FORMATTER, positive_float
from cli.failures import EXIT_USAGE, fail
from cli.run_options import add_run_arguments

if TYPE_CHECKING:
    from embedline.settings import RunSettings

__all__ = ["ENTRYPOINT", "add_parsers", "deployment_entry", "deployment_parameters"]

#: The flow, by module path: it loads wherever embedline is installed, from any directory.
ENTRYPOINT = "flows.embed_csv.embed_csv"

#: The command's own options: not run options, never parameters.
_OWN = ("name", "cron", "interval", "timezone", "work_pool", "prefect_file")

_HEADER = """\
# Deployments of embedline's embed-csv flow, written by `embedline deployment`.
# Deploy from this directory (relative paths in the parameters resolve here):
#   prefect --no-prompt deploy --prefect-file prefect.yaml --name NAME
# The build step records the directory you deploy from; the pull step makes it the flow
# run's working directory. Secrets: none here. The openai embedder reads EMBEDLINE_API_KEY
# (else OPENAI_API_KEY) from the worker's environment, or a Prefect Secret block.
"""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``deployment``."""
    parser = sub.add_parser(
        "deployment",
        help="write a deployment of INPUT (the options of run) into prefect.yaml",
        description="Write (add, or replace by NAME) a deployment of the embed-csv flow for "
        "INPUT into a prefect.yaml, with the options of `embedline run`: only those that "
        "differ from the defaults become parameters. Then: prefect deploy --prefect-file "
        "FILE --name NAME.",
        formatter_class=HELP_FORMATTER,
    )
    parser.add_argument("name", metavar="NAME", help="the deployment's name (embed-csv/NAME)")
    add_run_arguments(parser, command_options=False)
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--cron",
        default=None,
        metavar="EXPR",
        help="run on this cron schedule, e.g. '30 2 * * *' (default: no schedule: runs "
        "start from the UI or `prefect deployment run`)",
    )
    when.add_argument(
        "--interval",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="run every SECONDS (default: no schedule)",
    )
    parser.add_argument(
        "--timezone",
        default=None,
        metavar="TZ",
        help="the schedule's IANA time zone, e.g. Europe/Berlin (default: UTC)",
    )
    parser.add_argument(
        "--work-pool",
        default="embedline-local",
        metavar="POOL",
        help="the work pool whose workers run it (prefect work-pool create POOL --type process)",
    )
    parser.add_argument(
        "--prefect-file",
        default="prefect.yaml",
        metavar="FILE",
        help="the prefect.yaml to write into (created if missing, in a folder that exists)",
    )
    parser.set_defaults(handler=_deployment)


def _deployment(args: argparse.Namespace) -> int:
    from cli.run import settings_from

    settings = settings_from(args, not_parameters=_OWN)  # refused as `run` refuses: exit 2
    if args.timezone is not None and args.cron is None and args.interval is None:
        return fail(
            "embedline deployment: error: --timezone needs --cron or --interval "
            "(see 'embedline deployment --help')",
            EXIT_USAGE,
        )
    problem = _name_problem(args.name) or _schedule_problem(args.cron, args.timezone)
    if problem is not None:
        return fail(f"embedline deployment: error: {problem}", EXIT_USAGE)
    entry = deployment_entry(
        args.name,
        settings,
        cron=args.cron,
        interval_s=args.interval,
        timezone=args.timezone,
        work_pool=args.work_pool,
    )
    path = Path(args.prefect_file)
    from ruamel.yaml.error import YAMLError

    try:
        replaced = _write(path, entry)
    except (OSError, ValueError) as exc:
        return fail(f"embedline deployment: error: {path}: {exc}", EXIT_USAGE)
    except YAMLError as exc:  # its first line names the problem, its mark the line
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return fail(
            f"embedline deployment: error: {path}: not a prefect.yaml: not YAML{where}: "
            f"{getattr(exc, 'problem', None) or type(exc).__name__}",
            EXIT_USAGE,
        )
    verb = "replaced" if replaced else "added"
    print(f"{verb} deployment embed-csv/{args.name} in {path}")
    print(
        f"next: {_prefect_command()} --no-prompt deploy --prefect-file {shlex.quote(str(path))} "
        f"--name {shlex.quote(args.name)}"
    )
    return 0


def _prefect_command() -> str:
    """How to call the ``prefect`` beside this Python: ``prefect`` when the shell finds that
    one, else its path (``.venv/bin/prefect`` from the project's folder: embedline run as
    ``.venv/bin/embedline``, the environment not activated)."""
    beside = Path(sys.executable).with_name("prefect")
    found = shutil.which("prefect")
    if not beside.exists() or (found is not None and Path(found).resolve() == beside.resolve()):
        return "prefect"
    relative = os.path.relpath(beside)
    return shlex.quote(relative if not relative.startswith("..") else str(beside))


def _name_problem(name: str) -> str | None:
    """Why Prefect would refuse ``name`` as a deployment's name (its ``BANNED_CHARACTERS``,
    or nothing but blanks and quotes), or None."""
    from prefect.types.names import BANNED_CHARACTERS

    banned = sorted({c for c in name if c in BANNED_CHARACTERS})
    if banned:
        return (
            f"argument NAME: {name!r}: Prefect refuses {' '.join(banned)} in a deployment's "
            "name; choose a name without " + ", ".join(BANNED_CHARACTERS)
        )
    if not name.strip("' \""):
        return "argument NAME: empty: give the deployment a name, e.g. nightly"
    return None


def _schedule_problem(cron: str | None, timezone: str | None) -> str | None:
    """Why Prefect would refuse the schedule at ``prefect deploy`` (its ``CronSchedule``
    checks the cron string with croniter and the time zone against the IANA database), or
    None: refused here, before anything is written."""
    if cron is None and timezone is None:
        return None
    import datetime

    import pydantic
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule

    try:
        if cron is not None:
            CronSchedule(cron=cron, timezone=timezone)
        else:
            IntervalSchedule(interval=datetime.timedelta(seconds=60), timezone=timezone)
    except pydantic.ValidationError as exc:
        reason = str(exc.errors()[0].get("msg", "invalid")).removeprefix("Value error, ")
        option = "--cron" if cron is not None and "cron" in reason.lower() else "--timezone"
        return f"{option}: {reason}"
    return None


def deployment_parameters(settings: RunSettings) -> dict[str, dict[str, object]]:
    """The run's options that differ from their defaults (and ``input``), grouped as the
    flow takes them; JSON values (a tuple of kept columns becomes a list)."""
    from embedline.parameters import grouped
    from embedline.settings import PARAMETER_FIELDS

    names = {field: name for name, field in PARAMETER_FIELDS.items()}
    given = settings.model_dump(mode="json", exclude_defaults=True)
    flat = {names.get(field, field): value for field, value in given.items()}
    return grouped({"input": settings.input, **flat})


def deployment_entry(
    name: str,
    settings: RunSettings,
    *,
    cron: str | None,
    interval_s: float | None,
    timezone: str | None,
    work_pool: str,
) -> dict[str, Any]:
    """One item of ``prefect.yaml``'s ``deployments``: the flow, the pool, the parameters,
    the schedule. A scheduled run that fires while the last one still runs is cancelled
    (CANCEL_NEW, as the sample's nightly); a run asked for by hand waits (ENQUEUE)."""
    schedule: dict[str, Any] = {}
    if cron is not None:
        schedule["cron"] = cron
    elif interval_s is not None:
        schedule["interval"] = int(interval_s) if interval_s.is_integer() else interval_s
    if schedule and timezone is not None:
        schedule["timezone"] = timezone
    return {
        "name": name,
        "description": f"Embed {settings.input} (written by embedline deployment).",
        "entrypoint": ENTRYPOINT,
        "tags": ["embedline"],
        "work_pool": {
            "name": work_pool,
            "job_variables": {
                "env": {
                    # embedline's adapters log to "embedline.*": into the flow run's logs
                    "PREFECT_LOGGING_EXTRA_LOGGERS": "embedline",
                    "HF_HUB_OFFLINE": "1",  # the local model ships in its package
                }
            },
        },
        "parameters": deployment_parameters(settings),
        "concurrency_limit": {
            "limit": 1,
            "collision_strategy": "CANCEL_NEW" if schedule else "ENQUEUE",
        },
        "schedules": [{**schedule, "active": True}] if schedule else [],
    }


def _new_file() -> dict[str, Any]:
    """A ``prefect.yaml`` with the sample's build and pull steps and no deployment."""
    return {
        "name": "embedline",
        "prefect-version": _prefect_version(),
        "build": [
            {
                "prefect.deployments.steps.run_shell_script": {
                    "id": "checkout",
                    "script": "pwd",
                    "stream_output": False,
                }
            }
        ],
        "push": None,
        "pull": [
            {
                "prefect.deployments.steps.set_working_directory": {
                    "directory": "{{ checkout.stdout }}"
                }
            }
        ],
        "deployments": [],
    }


def _prefect_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prefect")
    except PackageNotFoundError:
        return "3"


def _write(path: Path, entry: dict[str, Any]) -> bool:
    """Add ``entry`` to ``path``'s deployments, or replace the one of its name, keeping the
    file's comments and other content; True if it replaced one.

    :raises ValueError: the file is not a prefect.yaml (not a mapping, deployments not a list).
    """
    import io

    from ruamel.yaml import YAML

    yaml = YAML()  # round trip: comments, order and anchors stay as written
    yaml.width = 100
    yaml.indent(mapping=2, sequence=4, offset=2)
    exists = path.exists()
    config: Any = yaml.load(path.read_text(encoding="utf-8")) if exists else _new_file()
    if config is None:
        config = _new_file()
    if not hasattr(config, "get"):
        raise ValueError("not a prefect.yaml (its top level is not a mapping)")
    deployments = config.get("deployments")
    if deployments is None:
        deployments = config["deployments"] = []
    if not isinstance(deployments, list):
        raise ValueError("not a prefect.yaml (its deployments are not a list)")
    same = [
        i for i, d in enumerate(deployments) if hasattr(d, "get") and d.get("name") == entry["name"]
    ]
    if same:
        deployments[same[0]] = entry
    else:
        deployments.append(entry)
    text = io.StringIO()
    yaml.dump(config, text)
    written = text.getvalue() if exists else _HEADER + text.getvalue()
    if not path.parent.is_dir():  # a typo in a folder's name is refused, not created
        raise ValueError(f"folder {path.parent} does not exist: create it, or name another file")
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(written, encoding="utf-8")
    temporary.replace(path)  # a reader never sees half a file
    return bool(same)
