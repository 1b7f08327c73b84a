"""What the ledger's batch records of a run say, read without calling the provider: a part
that failed for the token limit (and the cap it teaches the packing), a completed batch
whose file ids are late, a batch that answered every request, the parts' layouts merged,
the batches by status (for the progress report), and what a run that ends with batches still
running tells the user."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from adapters.ledger import BatchRecord
from embedline.models import BatchLayout
from embedline.progress import BatchCount

#: The enqueued-token limit as OpenAI's ``token_limit_exceeded`` message states it.
_LIMIT = re.compile(r"Limit:\s*([\d,]+)\s*enqueued tokens", re.IGNORECASE)

__all__ = [
    "all_answered",
    "batch_counts",
    "batch_requests",
    "failed_for_token_limit",
    "ids_late",
    "left_running_note",
    "merged_layouts",
    "one_input",
    "running_batches",
    "token_cap",
    "unconfirmed",
]

#: A batch's statuses that hold no request: ended, or unknown to the provider (said apart).
_NOT_RUNNING = frozenset({"completed", "failed", "expired", "cancelled", "not_found"})


def failed_for_token_limit(record: BatchRecord) -> bool:
    """The batch failed because the model's enqueued-token budget was full."""
    return record.status == "failed" and "token_limit_exceeded" in (record.error or "")


def token_cap(error: str, tokens: int | None, cap: int | None) -> int | None:
    """The estimated tokens a batch may pack after a ``token_limit_exceeded`` refusal whose
    message is ``error``, of a batch of ``tokens`` estimated tokens (None: unknown), with
    ``cap`` learned so far: the limit the message states (``estimate_tokens`` over-counts,
    so a batch within it by the estimate is within it), else half the refused batch (or of
    ``cap``); never above ``cap``. A batch of one part goes alone whatever the cap."""
    stated = _LIMIT.search(error)
    if stated is not None:
        new = int(stated.group(1).replace(",", ""))
    elif tokens or cap:
        new = min(t for t in (tokens, cap) if t) // 2
    else:
        return cap
    return max(1, min(new, cap or new))


def running_batches(records: Iterable[BatchRecord]) -> set[str]:
    """The ids of the batches of ``records`` that have not ended (a batch that packs many
    parts once); one unknown to the provider (``not_found``) is not among them."""
    return {r.batch_id for r in records if r.batch_id and r.status not in _NOT_RUNNING}


def unconfirmed(records: Iterable[BatchRecord], sent: Collection[tuple[int, int]]) -> set[str]:
    """The uploads of parts still ``creating`` whose create was sent (``sent``: chunk and
    part) but never confirmed: a batch made from them may be running."""
    return {
        r.input_file_id
        for r in records
        if r.state == "creating" and r.input_file_id and (r.idx, r.part) in sent
    }


def one_input(records: Iterable[BatchRecord], batch_id: str) -> bool:
    """Whether batch ``batch_id`` carries one request of one input (nothing smaller can
    be sent), by the layouts ``records`` record of its parts (False when one has none)."""
    layouts = [r.layout for r in records if r.batch_id == batch_id]
    requests = [rows for layout in layouts for _, rows in layout or ()]
    return None not in layouts and len(requests) == 1 and len(requests[0]) == 1


def ids_late(record: BatchRecord) -> bool:
    """``completed`` before the provider filled in its file ids: poll again."""
    return (
        record.status == "completed"
        and record.output_file_id is None
        and record.error_file_id is None
        and record.requests > 0
    )


def batch_requests(records: Iterable[BatchRecord]) -> dict[str, int]:
    """By batch id, the requests of the parts ``records`` record for it (a batch packs the
    parts of many chunks: its request count is theirs summed)."""
    total: dict[str, int] = {}
    for record in records:
        if record.batch_id:
            total[record.batch_id] = total.get(record.batch_id, 0) + record.requests
    return total


def all_answered(record: BatchRecord, requests: int | None = None) -> bool:
    """The batch completed with an answer for every request it carries: ``requests``, the
    batch's (``batch_requests``; default: the part's own, a batch of one part). A batch
    whose parts the ledger does not all record reads not answered: its files tell."""
    return (
        record.status == "completed"
        and record.failed == 0
        and record.completed == (record.requests if requests is None else requests)
    )


def merged_layouts(layouts: list[BatchLayout | None]) -> BatchLayout:
    """The requests of ``layouts``, each custom_id once, in order."""
    seen: dict[str, tuple[int, ...]] = {}
    for layout in layouts:
        for custom_id, rows in layout or ():
            seen.setdefault(custom_id, rows)
    return tuple(seen.items())


def batch_counts(records: Iterable[BatchRecord]) -> tuple[BatchCount, ...]:
    """The batches of ``records`` by status (or state, before a create), with their
    requests and how many are done, sorted by status: parts that share a batch (or an
    upload) are one batch, its requests theirs summed, its completed count the batch's."""
    batches: dict[object, list[BatchRecord]] = {}
    for record in records:
        key = record.batch_id or record.input_file_id or (record.idx, record.part)
        batches.setdefault(key, []).append(record)
    by_status: dict[str, list[list[BatchRecord]]] = {}
    for parts in batches.values():
        by_status.setdefault(parts[0].status or parts[0].state, []).append(parts)
    return tuple(
        BatchCount(
            status,
            len(group),
            sum(r.requests for parts in group for r in parts),
            sum(parts[0].completed for parts in group),
        )
        for status, group in sorted(by_status.items())
    )


def left_running_note(
    running: int,
    unconfirmed: int,
    run_key: str,
    *,
    rerun: str = "rerun the same command to collect them",
) -> str | None:
    """What a run that ends with ``running`` batches still running at the provider (and
    ``unconfirmed`` parts whose create was sent but not confirmed) tells the user: both
    ways on, collect (``rerun``) or cancel; None when there are neither."""
    if not running and not unconfirmed:
        return None
    if running:
        what = (
            f"{running} batch keeps" if running == 1 else f"{running} batches keep"
        ) + " running at the provider (billed when they complete)"
        if unconfirmed:
            what += f", and {unconfirmed} more may (their create was not confirmed)"
    else:
        what = (
            f"{unconfirmed} {'batch' if unconfirmed == 1 else 'batches'} may be running "
            "at the provider (their create was not confirmed; billed when they complete)"
        )
    return (
        f"{what}: {rerun} without paying again, or `embedline cancel-batches "
        f"{run_key[:12]}` to cancel them"
    )
