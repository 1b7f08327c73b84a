"""``embedline gc OUTPUT``: delete what no kept run needs (policy in ``tasks/gc/retention.py``).

Needs no Prefect: it lists and deletes objects directly (the ``gc-output`` flow wraps the
same functions for scheduled runs).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from cli.arguments import HELP_FORMATTER, positive_int, usage_line
from cli.failures import EXIT_USAGE, fail
from cli.run_options import DEFAULT_LEDGER

__all__ = ["add_parsers", "format_report"]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``gc``."""
    gc = sub.add_parser(
        "gc",
        help="delete manifests beyond retention and objects no kept manifest references",
        formatter_class=HELP_FORMATTER,
    )
    gc.add_argument("output", metavar="OUTPUT", help="local directory or s3://bucket/prefix")
    gc.add_argument(
        "--keep-runs",
        type=positive_int,
        default=None,
        help="keep the newest N manifests of each dataset (same columns, model "
        "and dimensions; default: all, unless --older-than)",
    )
    gc.add_argument(
        "--older-than",
        default=None,
        metavar="AGE",
        help="delete manifests older than AGE (90d, 36h, 2w; a bare number is "
        "days); with --keep-runs, only those both rules let go; the newest "
        "of each dataset always stays (default: no age rule)",
    )
    gc.add_argument(
        "--grace",
        default="24h",
        metavar="AGE",
        help="never delete anything younger than AGE (a bare number is days): "
        "runs in progress keep what they wrote (loads in progress keep their "
        "run by a renewed lease, whatever this says)",
    )
    gc.add_argument("--dry-run", action="store_true", help="print what would go; delete nothing")
    gc.add_argument(
        "--ledger",
        default=DEFAULT_LEDGER,
        help="ledger whose rows about deleted objects are dropped, if that file "
        "exists (relative to the current directory)",
    )
    gc.set_defaults(handler=_gc)


def format_report(done: Any, *, dry_run: bool) -> str:
    """One line per dataset (runs kept and deleted; column names, model and dimensions, no
    text or values), one per kind of object, then the total (objects and bytes)."""
    from cli.console import plural

    verb = "would delete" if dry_run else "deleted"
    lines = [
        f"kept       {plural(len(done.kept_runs), 'run')}"
        + (
            f", and {plural(done.leased, 'object')} that runs in progress need (live leases)"
            if done.leased
            else ""
        )
    ]
    for entry in done.datasets:
        lines.append(
            f"dataset    {entry.label()}: kept {plural(len(entry.kept), 'run')}, "
            f"{verb} {len(entry.deleted)}"
            + (f" ({len(entry.young)} more once older than --grace)" if entry.young else "")
        )

    for kind, items in done.groups().items():
        lines.append(
            f"{kind:<10} {verb} {plural(len(items), 'object')}, "
            f"{sum(i.size_bytes for i in items):,} bytes"
        )
    if done.temp_files:
        lines.append(f"temp files {verb} {len(done.temp_files):,}")
    objects, size = done.totals()
    lines.append(f"total      {verb} {plural(objects, 'object')}, {size:,} bytes")
    return "\n".join(lines)


def _gc(args: argparse.Namespace) -> int:
    from adapters.ledger import Ledger
    from adapters.object_store import open_store
    from embedline.errors import EmbedlineError
    from tasks.gc.retention import collect, parse_age, plan_gc

    flag = "--grace"
    try:
        grace_s = parse_age(args.grace)
        flag = "--older-than"
        older_than_s = None if args.older_than is None else parse_age(args.older_than)
    except ValueError as exc:
        return fail(usage_line("embedline gc", f"argument {flag}: {exc}"), EXIT_USAGE)
    try:
        store = open_store(args.output)
        plan = plan_gc(store, keep_runs=args.keep_runs, older_than_s=older_than_s, grace_s=grace_s)
        if args.dry_run:
            print(format_report(plan, dry_run=True))
            return 0
        ledger = Ledger(args.ledger) if os.path.exists(args.ledger) else None
        try:
            done = collect(store, plan, ledger=ledger, grace_s=grace_s)
        finally:
            if ledger is not None:
                ledger.close()
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    print(format_report(done, dry_run=False))
    return 0
