"""``embedline cancel-batches RUN``: cancel a run's Batch API batches at the provider.

What a cancelled batch completed before the cancel is still delivered (and billed); a rerun
of the run collects it and submits only the rest again.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from cli.arguments import DEFAULT_LEDGER, HELP_FORMATTER, LEDGER_HELP
from cli.failures import EXIT_USAGE, fail
from cli.ledger_lookup import find_run, open_ledger

if TYPE_CHECKING:
    from adapters.ledger import Ledger

__all__ = ["add_parsers", "batch_lines"]

#: A batch in one of these statuses changes no more (OpenAI Batch API reference).
_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``cancel-batches``."""
    cancel = sub.add_parser(
        "cancel-batches", formatter_class=HELP_FORMATTER,
        help="cancel the Batch API batches of a run (--batch-api) that have not ended")
    cancel.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    cancel.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    cancel.set_defaults(handler=_cancel_batches, resumable=False)


def batch_lines(ledger: Ledger, run_key: str) -> list[str]:
    """``batch<TAB>id<TAB>chunk=N part=P<TAB>status<TAB>requests=done/total failed=F`` per
    batch of the run (``embedline status RUN`` prints them after the run's line)."""
    lines = []
    for record in ledger.run_batches(run_key):
        lines.append(f"batch\t{record.batch_id or '-'}\tchunk={record.idx} part={record.part}\t"
                     f"{record.status or record.state}\trequests={record.completed}/"
                     f"{record.requests} failed={record.failed}")
    return lines


def _cancel_batches(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from adapters.embeddings import build_batch_client
    from embedline.errors import EmbedlineError
    from embedline.settings import RunSettings

    ledger = open_ledger(args.ledger)
    run = find_run(ledger, args.run)
    try:
        settings = RunSettings(**ledger.run_settings(run.run_key))
    except ValidationError:
        return fail("embedline: error: the run's recorded settings no longer validate", EXIT_USAGE)
    client = build_batch_client(settings)
    open_batches = [r for r in ledger.run_batches(run.run_key)
                    if r.batch_id and r.status not in _ENDED]
    try:
        for record in open_batches:
            batch = client.cancel_batch(str(record.batch_id))
            counts = batch.get("request_counts") or {}
            ledger.update_batch(run.run_key, str(record.batch_id),
                                status=str(batch.get("status")),
                                output_file_id=batch.get("output_file_id"),
                                error_file_id=batch.get("error_file_id"),
                                completed=int(counts.get("completed") or 0),
                                failed=int(counts.get("failed") or 0))
            print(f"{record.batch_id}\t{batch.get('status')}")
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    finally:
        client.close()
        ledger.close()
    print(f"embedline: {len(open_batches)} batches of run {run.run_key[:12]} asked to cancel; "
          "what they completed is still billed: rerun the run to collect it", file=sys.stderr)
    return 0
