"""``embedline cancel-batches RUN``: cancel a run's Batch API batches at the provider.

What a cancelled batch completed before the cancel is still delivered (and billed); a rerun
of the run collects it and submits only the rest again. A part the ledger still records
``creating`` whose input was uploaded (the process died, or the create failed, between the
provider's create and the ledger's record) is looked for in the account's batch list by its
metadata, as a run does, adopted into the ledger and cancelled too; one whose input was
never uploaded was never created. The ledger is a cache, the provider's list the truth: a
batch-mode run's batches the ledger does not record (a fresh or lost ledger) are found in the
list by their ``metadata`` within the completion window and cancelled too; with no ledger
that knows the run, ``--base-url URL`` names the provider to look in
(``tasks.batch.calls.run_batches_listed``).

Ends (docs/reference/cli.md): exit 0 with one line per batch asked to cancel and a summary line, or
one line saying there is nothing to cancel (a run without ``--batch-api``, every batch ended,
nothing ever created); exit 3 with one line naming a batch the provider does not know (404:
another API key or account, purged; marked ``not_found`` for ``embedline status``) after
the others were asked to cancel, or for an endpoint that refuses every connection.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from cli.arguments import HELP_FORMATTER
from cli.failures import EXIT_FATAL, EXIT_USAGE, fail
from cli.ledger_lookup import find_run, open_ledger
from cli.run_options import DEFAULT_LEDGER, LEDGER_HELP

if TYPE_CHECKING:
    from adapters.embeddings.openai_batch import BatchClient
    from adapters.ledger import BatchRecord, Ledger
    from embedline.errors import UnknownBatchError

__all__ = ["add_parsers", "batch_lines"]

#: A batch in one of these statuses changes no more (OpenAI Batch API reference).
_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
#: What ``status`` says of a batch the provider answered 404 for (``not_found``).
_NOT_FOUND_NOTE = (
    "unknown to the provider (HTTP 404): created with another API key or --base-url, or purged"
)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cancel-batches``."""
    cancel = sub.add_parser(
        "cancel-batches",
        formatter_class=HELP_FORMATTER,
        help="cancel the Batch API batches of a run (--batch-api) that have not ended",
    )
    cancel.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    cancel.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    cancel.add_argument(
        "--base-url",
        metavar="URL",
        help="when no ledger knows RUN (lost, or a fresh one): the Batch API to find its "
        "batches at by their metadata (the run's --base-url, e.g. https://api.openai.com/v1)",
    )
    cancel.set_defaults(handler=_cancel_batches, resumable=False)


def batch_lines(ledger: Ledger, run_key: str) -> list[str]:
    """``batch<TAB>id<TAB>chunk=N part=P<TAB>status<TAB>requests=done/total failed=F<TAB>note``
    per chunk's part of the run's batches, the counts the whole batch's (``embedline status
    RUN`` prints them after the run's line); ``note`` is empty, or why the batch cannot be
    collected (the provider's validation error, a 404 for the batch or one of its result
    files)."""
    from tasks.batch.records import batch_requests

    records = ledger.run_batches(run_key)
    # the provider's counts are the whole batch's, so the total is too: the requests of every
    # part the batch packs (a part's own total beside them read "6/1")
    totals = batch_requests(records)
    lines = []
    for record in records:
        note = _NOT_FOUND_NOTE if record.status == "not_found" else (record.error or "")
        total = totals.get(record.batch_id or "", record.requests)
        lines.append(
            f"batch\t{record.batch_id or '-'}\tchunk={record.idx} part={record.part}\t"
            f"{record.status or record.state}\trequests={record.completed}/"
            f"{total} failed={record.failed}\t{_one_field(note)}"
        )
    return lines


def _one_field(text: str) -> str:
    return " ".join(text.split())  # no tab or line break inside a field


def _nothing_to_cancel(records: list[BatchRecord], run_key: str) -> str | None:
    """The line saying why run ``run_key`` has nothing to cancel, or None if some batch may
    be running: one submitted that has not ended, or a part whose input was uploaded but
    whose create was not recorded (it may exist)."""
    if not records:
        return (
            f"run {run_key[:12]} has no Batch API batches (it ran without --batch-api): "
            "nothing to cancel"
        )
    if any(
        (r.batch_id and r.status not in _ENDED) or (r.state == "creating" and r.input_file_id)
        for r in records
    ):
        return None
    ended = len({r.batch_id for r in records if r.batch_id})  # a packed batch: once
    never = sum(1 for r in records if not r.batch_id)
    counts = ", ".join(
        part
        for part in (f"{ended} ended" if ended else "", f"{never} never created" if never else "")
        if part
    )
    return f"run {run_key[:12]} has no batch running at the provider ({counts}): nothing to cancel"


def _cancel_batches(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from adapters.embeddings import build_batch_client, close_embedders
    from embedline.errors import EmbedlineError
    from embedline.settings import RunSettings

    if args.base_url and not _ledger_knows(args.ledger, args.run):
        return _cancel_at_provider(args.base_url, args.run)
    ledger = open_ledger(args.ledger)
    try:
        run = find_run(ledger, args.run)
        try:
            settings = RunSettings.model_validate(ledger.run_settings(run.run_key))
        except ValidationError:
            settings = None
        records = ledger.run_batches(run.run_key)
        nothing = (
            _nothing_to_cancel(records, run.run_key)
            if records or settings is None or not settings.batch_api
            else _NO_BATCHES.format(run.run_key[:12])  # a fresh ledger: the provider may know
        )
        if nothing is not None and (settings is None or not settings.batch_api):
            # no client: a run without batches may have no API key
            print(f"embedline: {nothing}", file=sys.stderr)
            return 0
        if settings is None:
            return fail(
                "embedline: error: the run's recorded settings no longer validate", EXIT_USAGE
            )
        client = build_batch_client(settings)
        try:
            adopted, never_created = _adopt_creating(ledger, client, run.run_key)
            cancelled, unknown = _cancel_open(ledger, client, run.run_key)
            known = {r.batch_id for r in ledger.run_batches(run.run_key) if r.batch_id}
            unrecorded = _cancel_listed(client, run.run_key, known)
        except EmbedlineError as exc:
            return fail(f"embedline: error: {exc}", exc.exit_code)
        finally:
            close_embedders()  # the shared client closed and forgotten, not left closed
    finally:
        ledger.close()
    if nothing is not None and not cancelled and not unrecorded and not unknown:
        print(f"embedline: {nothing}", file=sys.stderr)
        return 0
    if unrecorded:
        adopted += unrecorded
        cancelled += unrecorded
    if cancelled or not unknown:
        print(
            f"embedline: {cancelled} batches of run {run.run_key[:12]} asked to cancel"
            + (
                f" ({adopted} of them found in the account's batch list: the ledger did "
                "not record their create)"
                if adopted
                else ""
            )
            + "; what they completed is still billed: rerun the run to collect it"
            + (
                f"; {never_created} parts were never created (a rerun submits them)"
                if never_created
                else ""
            ),
            file=sys.stderr,
        )
    if unknown:
        more = f" (and {len(unknown) - 1} more batches)" if len(unknown) > 1 else ""
        return fail(
            f"embedline: error: {unknown[0].cause}{more}; set the API key that created "
            "it (EMBEDLINE_API_KEY or OPENAI_API_KEY) and run cancel-batches again; if "
            "the provider no longer has it, nothing is left to cancel",
            EXIT_FATAL,
        )
    return 0


_NO_BATCHES = "run {} has no batch running at the provider: nothing to cancel"


def _ledger_knows(path: str, run: str) -> bool:
    """Whether a ledger at ``path`` exists and records a run ``run`` (key or prefix)."""
    import os

    from adapters.ledger import Ledger

    if not os.path.exists(path):
        return False
    ledger = Ledger(path)
    try:
        return ledger.find_run(run) is not None
    except ValueError:
        return True  # a bad or ambiguous prefix: find_run says so
    finally:
        ledger.close()


def _cancel_listed(
    client: BatchClient, run_key: str, known: set[str], listed: list[dict[str, Any]] | None = None
) -> int:
    """Ask to cancel each batch of run ``run_key`` (a key or prefix) that the account's
    list holds within the completion window (``listed``, when already read), has not ended
    and is not in ``known`` (the ledger's); print one line per batch; return how many.

    :raises EmbedlineError: the list or a cancel failed (the ones before it stand).
    """
    from tasks.batch.calls import WINDOW_S, run_batches_listed

    asked = 0
    if listed is None:
        listed = run_batches_listed(client, run_key, back_s=WINDOW_S)
    for batch in listed:
        if batch["id"] in known or batch.get("status") in _ENDED:
            continue
        answer = client.cancel_batch(str(batch["id"]))
        print(f"{batch['id']}\t{answer.get('status')}")
        asked += 1
    return asked


def _cancel_at_provider(base_url: str, run: str) -> int:
    """``cancel-batches RUN --base-url URL`` with no ledger that knows RUN: cancel the
    batches the account's list holds whose metadata names a run key starting with RUN."""
    from adapters.embeddings import api_key_from_env, auth_header_for
    from adapters.embeddings.openai_batch import BatchClient
    from embedline.errors import EmbedlineError
    from tasks.batch.calls import WINDOW_S, run_batches_listed

    prefix = run.strip().lower()
    if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
        return fail(
            "embedline: error: a run key prefix needs at least 8 hex characters", EXIT_USAGE
        )
    client = BatchClient(
        base_url=base_url, api_key=api_key_from_env(), auth_header=auth_header_for(None)
    )
    try:
        listed = run_batches_listed(client, prefix, back_s=WINDOW_S)
        runs = {str((b.get("metadata") or {}).get("embedline_run")) for b in listed}
        if len(runs) > 1:
            return fail(
                f"embedline: error: run key prefix {prefix!r} is ambiguous; give more characters",
                EXIT_USAGE,
            )
        cancelled = _cancel_listed(client, prefix, set(), listed)
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    finally:
        client.close()
    if not cancelled:
        print(f"embedline: {_NO_BATCHES.format(prefix[:12])}", file=sys.stderr)
        return 0
    print(
        f"embedline: {cancelled} batches of run {prefix[:12]} asked to cancel (found in the "
        "account's batch list by their metadata); what they completed is still billed: "
        "rerun the run to collect it",
        file=sys.stderr,
    )
    return 0


def _cancel_open(
    ledger: Ledger, client: BatchClient, run_key: str
) -> tuple[int, list[UnknownBatchError]]:
    """Ask the provider to cancel every batch of the run that has not ended; print one line
    per batch. Returns (batches asked, the 404s of those the provider does not know: marked
    ``not_found`` in the ledger, the others are cancelled anyway).

    :raises EmbedlineError: any other failure of a cancel (the ones before it stand).
    """
    from embedline.errors import UnknownBatchError

    cancelled, unknown = 0, []
    asked: set[str] = set()  # a batch that packs many chunks' parts: cancelled once
    for record in ledger.run_batches(run_key):
        if not record.batch_id or record.status in _ENDED or record.batch_id in asked:
            continue
        asked.add(record.batch_id)
        try:
            batch = client.cancel_batch(record.batch_id)
        except UnknownBatchError as exc:
            ledger.mark_batch_not_found(run_key, record.batch_id)
            unknown.append(exc)
            continue
        counts = batch.get("request_counts") or {}
        ledger.update_batch(
            run_key,
            record.batch_id,
            status=str(batch.get("status")),
            output_file_id=batch.get("output_file_id"),
            error_file_id=batch.get("error_file_id"),
            completed=int(counts.get("completed") or 0),
            failed=int(counts.get("failed") or 0),
        )
        print(f"{record.batch_id}\t{batch.get('status')}")
        cancelled += 1
    return cancelled, unknown


def _adopt_creating(ledger: Ledger, client: BatchClient, run_key: str) -> tuple[int, int]:
    """Record the provider's batch of each part still ``creating`` that the account's list
    holds (the batch created from the part's upload, ``tasks.batch.calls.listed_inputs``);
    return (adopted, not found). Parts whose input was never uploaded were never created:
    not looked for, counted not found.

    :raises EmbedlineError: the list could not be read.
    """
    creating = [r for r in ledger.run_batches(run_key) if r.state == "creating"]
    if not any(r.input_file_id for r in creating):
        return 0, len(creating)
    from tasks.batch.calls import listed_inputs

    listed = listed_inputs(client, run_key)
    adopted = 0
    for record in creating:
        batch = listed.get(record.input_file_id or "")
        if batch is None:
            continue
        ledger.mark_batch_submitted(
            run_key,
            record.idx,
            record.part,
            batch_id=str(batch["id"]),
            input_file_id=batch.get("input_file_id"),
            status=str(batch.get("status")),
        )
        adopted += 1
    return adopted, len(creating) - adopted
