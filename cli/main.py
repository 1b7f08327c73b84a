"""The ``embedline`` parser and dispatch: each command module registers its subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cli import gc, inspect, load, run, search

__all__ = ["main"]

_COMMAND_MODULES = (run, inspect, load, search, gc)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedline",
        description="Embed a CSV's text column and publish the vectors exactly once.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _COMMAND_MODULES:
        module.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embedline`` console script; returns the exit code (DESIGN §3)."""
    args = _parser().parse_args(argv)
    try:
        code = int(args.handler(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`embedline status | head -1`): nothing failed. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again
        # (Python docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code
