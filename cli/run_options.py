"""The command line of ``embedline run`` and ``embedline retry-failed``. ``cli.run`` registers
the two commands and their handlers.

``run``'s options are the flow's parameters, built from the records of
``cli/run_options_table.py``, which ``cli/gen_run_options.py`` generates from the fields of
``embedline.run_fields.RunFields``: their names, defaults, help, choices and types are declared
there, once. The CLI's own options (``--progress-interval``, ``--debug``) are declared here.
"""

from __future__ import annotations

import argparse
from typing import Any

from cli import arguments
from cli.arguments import RunOption, non_negative_float
from cli.run_options_table import RUN_OPTIONS

__all__ = [
    "DEFAULT_LEDGER",
    "INDEX_HELP",
    "LEDGER_HELP",
    "MAX_DELETE_HELP",
    "add_retry_arguments",
    "add_run_arguments",
    "run_option",
]


def run_option(dest: str) -> RunOption:
    """``embedline run``'s option of flow parameter ``dest``.

    :raises LookupError: ``run`` has no such option.
    """
    for option in RUN_OPTIONS:
        if option.dest == dest:
            return option
    raise LookupError(f"embedline run has no option {dest!r}")


#: Options of ``run`` other commands take too, with the same default and help.
DEFAULT_LEDGER = str(run_option("ledger").default)
LEDGER_HELP = run_option("ledger").help
MAX_DELETE_HELP = run_option("max_delete_fraction").help
INDEX_HELP = run_option("index").help


def add_run_arguments(run: argparse.ArgumentParser, *, command_options: bool = True) -> None:
    """The options of ``embedline run``: the flow's parameters, then (``command_options``) the
    CLI's own (``--progress-interval``, ``--debug``); ``embedline deployment`` takes the
    first only."""
    for option in RUN_OPTIONS:
        _add(run, option)
    if not command_options:
        return
    run.add_argument(
        "--progress-interval",
        type=non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="when stderr is not a terminal, a progress line every SECONDS (0: none)",
    )
    run.add_argument(
        "--debug",
        action="store_true",
        help="show tracebacks of expected failures (also in Dask workers)",
    )


def add_retry_arguments(retry: argparse.ArgumentParser) -> None:
    """The arguments of ``embedline retry-failed``: the run, and what to send again."""
    retry.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    retry.add_argument(
        "--dead-letters",
        action="store_true",
        help="also send again the run's dead letters of kind rejected, "
        "too_long or server_error (only them; empty texts stay final)",
    )
    retry.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    retry.add_argument("--debug", action="store_true", help="show tracebacks of expected failures")


def _add(parser: argparse.ArgumentParser, option: RunOption) -> None:
    """``parser.add_argument`` of ``option``, naming only what the record sets."""
    kwargs: dict[str, Any] = {"help": option.help}
    if option.action != "store":
        kwargs["action"] = option.action
    if option.type is not None:
        kwargs["type"] = getattr(arguments, option.type)
    if option.choices is not None:
        kwargs["choices"] = option.choices
    if option.metavar is not None:
        kwargs["metavar"] = option.metavar
    if not option.flags:  # the positional argument: its name is its dest
        parser.add_argument(option.dest, **kwargs)
        return
    parser.add_argument(*option.flags, dest=option.dest, default=option.default, **kwargs)
