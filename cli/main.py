"""The ``embedline`` parser and dispatch: each command module registers its subcommands."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from cli import batches, deployment, gc, index, inspect, load, recall, run, search
from cli.arguments import usage_line
from cli.command_signals import install_interrupt_handlers, redeliver_lost_interrupts
from cli.started import interrupted_line
from embedline.errors import DiskFullError
from embedline.interrupts import exit_code_for, interrupt_of, signal_of
from embedline.shutdown import STOP
from embedline.tracebacks import DEBUG_ENV

__all__ = ["main"]

_COMMAND_MODULES = (run, deployment, inspect, load, index, search, recall, gc, batches)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, ``PROG: error: MESSAGE (see 'PROG
    --help')``, exit 2 (docs/reference/cli.md): argparse's own prints the whole usage first, twenty
    lines for ``run`` above the one that says what was wrong. Subcommand parsers are of
    this class too (``add_subparsers`` makes them of the parser's own class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations (--dim for --dimensions): a scheduled deployment's command line
        # that works today would fail, or name another option, once an option is added
        # that shares the prefix.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, usage_line(self.prog, message) + "\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, but a value that starts with a single minus and is not an option
        (``--grace -1h``, ``--timeout -inf``, ``--id-column -id``) is the option's value,
        which its own check then takes or refuses by name: argparse takes only plain
        negative numbers as values and answered "expected one argument"."""
        args = _values_joined(self, list(sys.argv[1:] if args is None else args))
        _refuse_abbreviations(self, args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, but an argument no parser took is refused by the subcommand's parser,
        so the line points to that command's ``--help``."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            parser = _commands(self).get(command, self) if command is not None else self
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser`` by name (none for a subcommand's own)."""
    return next(
        (a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {}
    )


def _values_joined(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """``args`` with each ``--option -1h`` whose option takes one value written
    ``--option=-1h`` (``-h``, an option of the parser, and ``--anything`` are left as
    they are: more likely a forgotten value than a value)."""
    options = parser._option_string_actions
    out: list[str] = []
    for arg in args:
        action = options.get(out[-1]) if out else None
        if (
            action is not None
            and action.nargs is None
            and action.option_strings
            and re.match(r"-[^-]", arg)
            and arg not in options
        ):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _refuse_abbreviations(parser: argparse.ArgumentParser, args: list[str]) -> None:
    """Refuse a long option that abbreviates one of ``parser``'s, naming what it may
    mean, before argparse reports anything else (on its own, argparse says "--to is
    required" to a user who types ``--t``). Stops at ``--`` and at a subcommand: its own
    parser checks the rest."""
    commands = _commands(parser)
    for arg in args:
        if arg == "--" or arg in commands:
            return
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in parser._option_string_actions:
            continue
        meant = sorted(o for o in parser._option_string_actions if o.startswith(name))
        if meant:
            parser.error(
                f"unrecognized arguments: {arg} (options are written in full: {' or '.join(meant)})"
            )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="embedline",
        description="Embed a CSV's text column and publish the vectors exactly once.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _COMMAND_MODULES:
        module.add_parsers(sub)
    return parser


def _version() -> str:
    """The installed package's version (``pyproject.toml``), or "unknown" when run from a
    checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedline")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embedline`` console script; returns the exit code
    (docs/reference/cli.md).

    Ctrl-C or SIGTERM before a run dispatches chunks (planning, waiting for Prefect's
    temporary server) ends with one line and 130 or 143, after the cleanups ran (the
    temporary server stopped, a started run marked ``interrupted``); a second one while
    they run exits at once; while chunks are dispatched, ``flows.signals`` handles them
    (a grace period first).
    """
    args = _parser().parse_args(argv)
    if not os.environ.get(DEBUG_ENV):
        from cli.prefect_env import (
            EXIT_DRAIN_LOGGERS,
            drop_drain_progress,
            drop_prefect_settings_errors,
        )

        logging.getLogger("prefect.plugins").addFilter(drop_prefect_settings_errors)
        for name in EXIT_DRAIN_LOGGERS:
            logging.getLogger(name).addFilter(drop_drain_progress)
    STOP.begin_command()
    previous = install_interrupt_handlers()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_unraisable, previous_hook)
    try:
        code = int(args.handler(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`embedline status | head -1`): nothing failed. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again
        # (Python docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes an exit code here
        if isinstance(exc, DiskFullError) and not os.environ.get(DEBUG_ENV):
            sys.stderr.write(f"embedline: error: {exc}\n")  # any command, one line
            return exc.exit_code
        interrupt = interrupt_of(exc)
        if interrupt is None:
            return _invalid_prefect_setting(exc)
        return _interrupted(interrupt, resumable=getattr(args, "resumable", True))
    finally:
        sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code


def _invalid_prefect_setting(exc: BaseException) -> int:
    """Exit 2 with one line for a Prefect setting Prefect refuses; re-raise anything else."""
    from cli.prefect_env import invalid_prefect_setting

    message = invalid_prefect_setting(exc)
    if message is None or os.environ.get(DEBUG_ENV):
        raise exc
    sys.stderr.write(f"embedline: error: {message}\n")
    return 2


def _unraisable(default: Any, unraisable: Any) -> None:
    """An interrupt lost in a ``__del__`` or weakref callback is delivered again
    (``cli.command_signals.redeliver_lost_interrupts``) and printed only with ``--debug``; anything
    else goes to ``default``."""
    if not redeliver_lost_interrupts(unraisable) or os.environ.get(DEBUG_ENV):
        default(unraisable)


def _interrupted(exc: BaseException, *, resumable: bool) -> int:
    """One line for an interrupt that reached the top; returns 130 (SIGINT) or 143. The
    hard-exit hooks run first: a run recorded before the flow took over reads
    ``interrupted``. After this command committed its run, the line says so (a rerun has
    nothing to redo); a read-only command (``resumable`` False) has nothing to resume."""
    STOP.exit.run_hard_exit_hooks()
    signum = signal_of(exc)
    cause = STOP.stop_cause(signum)  # a SIGTERM may be a cancel from Prefect
    committed = STOP.report.committed()
    if committed is not None:
        line = interrupted_line(
            signum,
            f" after run {committed.run_key[:12]} was committed ({committed.manifest_uri})",
            f": {committed.todo}",
            cause,
        )
    elif resumable and STOP.report.left_running():
        line = interrupted_line(signum, f"; {STOP.report.left_running()}", todo="", cause=cause)
    elif resumable:
        line = interrupted_line(signum, cause=cause)
    else:
        line = interrupted_line(signum, todo=None, cause=cause)
    sys.stderr.write(line)
    return exit_code_for(signum)
