"""``embedline status`` and ``embedline dead-letters``: read the ledger, print no text."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from cli.arguments import HELP_FORMATTER
from cli.ledger_lookup import find_run, open_ledger
from cli.run_options import DEFAULT_LEDGER, LEDGER_HELP

if TYPE_CHECKING:
    from adapters.ledger import Ledger
    from adapters.ledger.records import RunRecord

__all__ = ["add_parsers", "run_status", "tsv_field"]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``status`` and ``dead-letters``."""
    status = sub.add_parser(
        "status", help="one line per run in the ledger", formatter_class=HELP_FORMATTER
    )
    status.add_argument("run", nargs="?", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    status.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    status.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per run and line, for monitors (fields: "
        "docs/reference/cli.md, 'embedline status')",
    )
    status.set_defaults(handler=_status, resumable=False)
    dead = sub.add_parser(
        "dead-letters",
        help="id<TAB>reason<TAB>http_status per dead letter",
        formatter_class=HELP_FORMATTER,
    )
    dead.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    dead.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    dead.add_argument(
        "--sink",
        metavar="URI",
        default=None,
        help="list the rows this sink refused for good when RUN was loaded into "
        "it (id<TAB>reason<TAB>sqlstate<TAB>message) instead",
    )
    dead.set_defaults(handler=_dead_letters, resumable=False)


_CHUNK_STATES = ("published", "failed", "running", "pending")


def _status(args: argparse.Namespace) -> int:
    """One tab-separated line per run, always 8 fields: key, state, ``rows=… dead_letters=…``,
    ``chunks …`` by state, input, output, updated, and why the lowest failed chunk failed
    (empty when none did); with RUN, its Batch API batches follow, one line each, first
    field ``batch`` (``cli.batches.batch_lines``). With ``--json``, ``run_status`` as one
    JSON object per line."""
    ledger = open_ledger(args.ledger)
    runs = [find_run(ledger, args.run)] if args.run else ledger.runs()
    for run in runs:
        facts = run_status(ledger, run)
        if args.json:
            print(json.dumps(facts, sort_keys=True))
            continue
        chunks = " ".join(f"{s}={facts['chunks'][s]}" for s in _CHUNK_STATES)
        print(
            f"{run.run_key}\t{facts['status']}\trows={facts['rows_published']}/"
            f"{run.input_rows} dead_letters={run.rows_failed}\tchunks {chunks}\t"
            f"{run.input_name}\t{run.output_uri}\t{run.updated_at}\t"
            f"{tsv_field(facts['failure'] or '')}"
        )
        if args.run:  # Batch API mode: one line per batch after the run's
            from cli.batches import batch_lines

            for line in batch_lines(ledger, run.run_key):
                print(line)
    return 0


def run_status(ledger: Ledger, run: RunRecord) -> dict[str, Any]:
    """A run's state as the ledger knows it, JSON-ready (docs/reference/cli.md, ``status --json``):
    ``run_key``, ``status`` (``crashed`` when a ``running`` run's process is gone),
    ``input``, ``input_rows``, ``output``, ``manifest_uri``, ``updated_at`` (UTC ISO-8601),
    ``rows_published``, ``dead_letters`` (rows), ``chunks`` (count per state),
    ``failure`` (why the lowest failed chunk failed, or None) and ``committed`` (the
    ``embedline.run.committed`` event's payload, or None). Counts only, never text."""
    states = ledger.live_state_counts(run.run_key)
    status = run.status
    if status == "running" and ledger.run_process_gone(run.run_key):
        status = "crashed"  # its process is gone without recording an end
    published = (
        run.rows_published
        if status == "complete"
        else max(run.rows_published, ledger.published_rows(run.run_key))
    )
    failure = ledger.first_failure(run.run_key) if states.get("failed") else None
    more = states.get("failed", 0) - 1
    why = (
        None
        if failure is None
        else (
            f"chunk {failure[0]} failed"
            + (f" (and {more} more)" if more else "")
            + f": {failure[1]}"
        )
    )
    return {
        "run_key": run.run_key,
        "status": status,
        "input": run.input_name,
        "input_rows": run.input_rows,
        "output": run.output_uri,
        "manifest_uri": run.manifest_uri,
        "updated_at": run.updated_at,
        "rows_published": published,
        "dead_letters": run.rows_failed,
        "chunks": {s: states.get(s, 0) for s in _CHUNK_STATES},
        "failure": why,
        "committed": ledger.run_facts(run.run_key) if status == "complete" else None,
    }


def tsv_field(value: str) -> str:
    """Escape backslash, tab, CR, LF and NUL so an id (quoted CSV fields may hold them) stays
    one printable TSV field (the convention of PostgreSQL's COPY text format: NUL as ``\\x00``)."""
    return (
        value.replace("\\", "\\\\")
        .replace("\t", "\\t")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\x00", "\\x00")
    )


def _dead_letters(args: argparse.Namespace) -> int:
    if args.sink:
        from adapters.sinks import validate_sink_uri
        from cli.failures import EXIT_USAGE, fail
        from embedline.errors import InputError

        try:
            validate_sink_uri(args.sink)
        except InputError as exc:  # one line, as load's --to (it was a traceback)
            return fail(f"embedline: error: {exc}", EXIT_USAGE)
    ledger = open_ledger(args.ledger)
    run = find_run(ledger, args.run)
    if args.sink:
        from adapters.sinks import open_sink

        for refused in ledger.load_dead_letters(open_sink(args.sink).identity, run.run_key):
            print(
                f"{tsv_field(refused.id)}\t{refused.reason}\t{refused.sqlstate or ''}\t"
                f"{tsv_field(refused.message)}"
            )
        return 0
    for dead in ledger.run_dead_letters(run.run_key):
        status = "" if dead.http_status is None else str(dead.http_status)
        print(f"{tsv_field(dead.id)}\t{dead.reason}\t{status}")
    return 0
