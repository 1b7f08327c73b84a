"""The argparse pieces the commands share: value types, the help formatter, and the record of
one ``embedline run`` option."""

from __future__ import annotations

import argparse
import math
from typing import NamedTuple, TypeVar

__all__ = [
    "HELP_FORMATTER",
    "RunOption",
    "fraction",
    "json_object",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "template_text",
    "usage_line",
]


class RunOption(NamedTuple):
    """One option of ``embedline run``, as ``argparse.add_argument`` takes it: the records of
    ``cli/run_options_table.py``, generated from ``RunFields`` (``cli/gen_run_options.py``)."""

    dest: str  # the flow parameter (``timeout`` for RunSettings.timeout_s)
    flags: tuple[str, ...]  # ("--chunk-size",); () for the positional argument
    help: str  # as argparse takes it: ``%`` doubled
    action: str = "store"  # store, store_true or store_false
    default: object = None  # argparse.SUPPRESS: absent from the namespace unless given
    type: str | None = None  # an argparse type of this module, by name
    choices: tuple[str, ...] | None = None
    metavar: str | None = None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default ("(default: 1000)"). An option whose
    default is None (unset) says in its own words what unset means ("(default: no limit)"):
    argparse's "(default: None)" says nothing, or the opposite of the text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


HELP_FORMATTER = HelpFormatter


_Number = TypeVar("_Number", int, float)


def _parsed(kind: type[_Number], text: str, rule: str) -> _Number:
    """``kind(text)``; what it cannot read is worded by the rule the value breaks, not by
    argparse's "invalid positive_int value"."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None


def usage_line(prog: str, message: str) -> str:
    """The one line of a usage error (docs/reference/cli.md): ``PROG: error: MESSAGE (see 'PROG
    --help')``, for argparse's errors and for the checks made after parsing alike."""
    return f"{prog}: error: {message} (see '{prog} --help')"


def non_negative_int(text: str) -> int:
    """argparse type: an integer ≥ 0."""
    value = _parsed(int, text, "must be a whole number, 0 or more")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    value = _parsed(int, text, "must be a whole number, at least 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = _parsed(float, text, "must be a finite number greater than 0")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float ≥ 0."""
    value = _parsed(float, text, "must be a finite number, 0 or more")
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text}")
    return value


def fraction(text: str) -> float:
    """argparse type: a share from 0 to 1 (``--max-delete-fraction``)."""
    value = _parsed(float, text, "must be a number from 0 to 1")
    if not (0 <= value <= 1):
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text}")
    return value


def template_text(text: str) -> str:
    """argparse type of ``--text-template``: ``\\n``, ``\\t`` (and ``\\\\``) become the
    characters a shell's single quotes cannot hold (``embedline.template.unescape_cli``)."""
    from embedline.template import unescape_cli

    return unescape_cli(text)


def json_object(text: str) -> dict[str, object]:
    """argparse type of ``--dask-cluster-kwargs``: a JSON object."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object {{...}}, got {text}")
    return value
