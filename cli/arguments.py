"""The argparse pieces the commands share: value types, the help formatter, shared defaults
and help texts."""

from __future__ import annotations

import argparse
import math
from typing import TypeVar

__all__ = [
    "DEFAULT_LEDGER",
    "HELP_FORMATTER",
    "INDEX_HELP",
    "LEDGER_HELP",
    "MAX_DELETE_HELP",
    "fraction",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "usage_line",
]

DEFAULT_LEDGER = ".embedline/ledger.sqlite3"
LEDGER_HELP = (
    "the SQLite ledger; a relative path is relative to the current directory, so "
    "run `status`, `dead-letters` and `retry-failed` where `run` ran, or pass the "
    "same --ledger"
)
MAX_DELETE_HELP = (
    "stop, before deleting anything, a load that would delete more than this "
    "share of the rows the sink holds, or a commit whose change set removes more "
    "than this share of the previous run's rows (a cut-short export); exit 2 "
    "with the counts. 1 allows any delete"
)

INDEX_HELP = (
    "when the sink's index is built (pgvector's HNSW): now, after the load, in its own "
    "build-index task; or later: the load skips it and says so, and `embedline index "
    "TARGET` builds it (e.g. once maintenance_work_mem is raised)"
)


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
