"""``embedline cancel-batches RUN``: cancel a run's Batch API batches at the provider.

What a cancelled batch completed before the cancel is still delivered (and billed); a rerun
of the run collects it and submits only the rest again. A part the ledger still records
``creating`` whose input was uploaded (the process died, or the create failed, between the
provider's create and the ledger's record) is looked for in the account's batch list by its
metadata, as a run does, adopted into the ledger and cancelled too; one whose input was
never uploaded was never created.

A run with nothing to cancel (it ran without ``--batch-api``, every batch ended, nothing
was ever created) gets one line saying so, exit 0, without contacting the provider.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from cli.arguments import DEFAULT_LEDGER, HELP_FORMATTER, LEDGER_HELP
from cli.failures import EXIT_USAGE, fail
from cli.ledger_lookup import find_run, open_ledger

if TYPE_CHECKING:
    from adapters.embeddings.openai_batch import BatchClient
    from adapters.ledger import BatchRecord, Ledger

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


def _nothing_to_cancel(records: list[BatchRecord], run_key: str) -> str | None:
    """The line saying why run ``run_key`` has nothing to cancel, or None if some batch may
    be running: one submitted that has not ended, or a part whose input was uploaded but
    whose create was not recorded (it may exist)."""
    if not records:
        return (f"run {run_key[:12]} has no Batch API batches (it ran without --batch-api): "
                "nothing to cancel")
    if any((r.batch_id and r.status not in _ENDED) or (r.state == "creating" and
                                                        r.input_file_id) for r in records):
        return None
    ended = sum(1 for r in records if r.batch_id)
    never = len(records) - ended
    counts = ", ".join(part for part in (f"{ended} ended" if ended else "",
                                         f"{never} never created" if never else "") if part)
    return f"run {run_key[:12]} has no batch running at the provider ({counts}): nothing to cancel"


def _cancel_batches(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from adapters.embeddings import build_batch_client
    from embedline.errors import EmbedlineError
    from embedline.settings import RunSettings

    ledger = open_ledger(args.ledger)
    run = find_run(ledger, args.run)
    nothing = _nothing_to_cancel(ledger.run_batches(run.run_key), run.run_key)
    if nothing is not None:  # before: "0 batches … asked to cancel"; no client is built
        ledger.close()
        print(f"embedline: {nothing}", file=sys.stderr)
        return 0
    try:
        settings = RunSettings(**ledger.run_settings(run.run_key))
    except ValidationError:
        return fail("embedline: error: the run's recorded settings no longer validate", EXIT_USAGE)
    client = build_batch_client(settings)
    try:
        adopted, never_created = _adopt_creating(ledger, client, run.run_key)
        open_batches = [r for r in ledger.run_batches(run.run_key)
                        if r.batch_id and r.status not in _ENDED]
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
    print(f"embedline: {len(open_batches)} batches of run {run.run_key[:12]} asked to cancel"
          + (f" ({adopted} of them found in the account's batch list: their create was not "
             "recorded)" if adopted else "")
          + "; what they completed is still billed: rerun the run to collect it"
          + (f"; {never_created} parts were never created (a rerun submits them)"
             if never_created else ""), file=sys.stderr)
    return 0


def _adopt_creating(ledger: Ledger, client: BatchClient, run_key: str) -> tuple[int, int]:
    """Record the provider's batch of each part still ``creating`` that the account's list
    holds (by metadata, ``flows.batch.listed_parts``); return (adopted, not found). Parts
    whose input was never uploaded were never created: not looked for, counted not found.

    :raises EmbedlineError: the list could not be read.
    """
    creating = [r for r in ledger.run_batches(run_key) if r.state == "creating"]
    if not any(r.input_file_id for r in creating):
        return 0, len(creating)
    from flows.batch import listed_parts

    listed = listed_parts(client, run_key)
    adopted = 0
    for record in creating:
        batch = listed.get((record.idx, record.part))
        if batch is None:
            continue
        ledger.mark_batch_submitted(run_key, record.idx, record.part, batch_id=str(batch["id"]),
                                    input_file_id=batch.get("input_file_id"),
                                    status=str(batch.get("status")))
        adopted += 1
    return adopted, len(creating) - adopted
