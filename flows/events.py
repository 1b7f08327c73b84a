"""The Prefect events a run and a load emit, for automations and downstream deployments.

``embedline.run.committed`` fires once when a run's manifest is written (the commit point,
docs/reference/output-layout.md); ``embedline.load.completed`` when a load into a sink finished with
exit 0. Both carry counts only (no text, no kept-column values, no secrets: sink URIs never hold a
password, ``settings._sink_has_no_password``). Emitted inside a flow run, Prefect's events
worker adds the flow run, flow and deployment as related resources
(``prefect.events.related.related_resources_from_run_context``), so an automation or a
deployment trigger can match ``embedline.run.committed`` of one deployment
(docs: https://docs.prefect.io/v3/concepts/events). Outside a run, or without a Prefect API,
nothing is sent.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from embedline.summary import LoadSummary, RunSummary, run_cost

__all__ = [
    "DEAD_LETTERS_EXCEEDED",
    "LOAD_COMPLETED",
    "RUN_COMMITTED",
    "THRESHOLD_VARIABLE",
    "dead_letters_threshold",
    "emit_load_completed",
    "emit_run_committed",
    "load_payload",
    "run_payload",
]

RUN_COMMITTED = "embedline.run.committed"
LOAD_COMPLETED = "embedline.load.completed"
DEAD_LETTERS_EXCEEDED = "embedline.run.dead-letters-exceeded"
THRESHOLD_VARIABLE = "embedline_dead_letters_alert_threshold"

_RUN_FIELDS = (
    "run_key",
    "output",
    "manifest_uri",
    "rows_total",
    "rows_published",
    "rows_failed",
    "rows_reused",
    "rows_added",
    "rows_changed",
    "rows_removed",
    "rows_unchanged",
    "tokens",
    "inputs",
    "generation",
)
_LOAD_FIELDS = (
    "run_key",
    "sink",
    "mode",
    "rows_loaded",
    "rows_deleted",
    "rows_skipped",
    "rows_failed",
    "chunks_total",
    "wall_s",
)


def run_payload(summary: RunSummary) -> dict[str, Any]:
    """The facts of a committed run: keys, rows (counts), ``dead_letters`` (rows), the change
    set's counts (rows; None for a first run without a base), ``tokens`` and ``cost_usd``
    (None without ``--price-per-million-tokens``)."""
    payload = {name: getattr(summary, name) for name in _RUN_FIELDS}
    payload["dead_letters"] = summary.rows_failed
    price = summary.price_per_million_tokens
    payload["batch_tokens"] = summary.batch_tokens
    payload["batch_inputs"] = summary.batch_inputs
    payload["cost_usd"] = (
        None
        if price is None
        else round(run_cost(summary.tokens, summary.batch_tokens, price)[0], 6)
    )  # batch tokens at half
    return payload


def load_payload(summary: LoadSummary) -> dict[str, Any]:
    """The facts of a finished load: run key, sink URI, ``mode`` (``replace``/``upsert``…),
    rows upserted (``rows_loaded``) and deleted, and ``wall_s`` (seconds)."""
    return {name: getattr(summary, name) for name in _LOAD_FIELDS}


def emit_run_committed(
    summary: RunSummary,
    *,
    dead_letters_threshold: int | None = None,
) -> None:
    """Emit ``embedline.run.committed`` for ``summary`` (a committed run's); and
    ``embedline.run.dead-letters-exceeded`` too when its dead letters (rows) are above
    ``dead_letters_threshold`` (rows: the Prefect Variable read by ``dead_letters_threshold()``
    when the run started; None: never). Sends nothing without ``PREFECT_API_URL``."""
    if not _api_configured():
        return
    payload = run_payload(summary)
    labels = {"embedline.output": str(summary.output)}
    resource = f"embedline.run.{summary.run_key}"
    _emit(
        RUN_COMMITTED, resource, payload, labels, event_id=_commit_event_id(RUN_COMMITTED, summary)
    )
    threshold = dead_letters_threshold
    if threshold is not None and summary.rows_failed > threshold:
        _emit(
            DEAD_LETTERS_EXCEEDED,
            resource,
            {**payload, "threshold": threshold},
            labels,
            event_id=_commit_event_id(DEAD_LETTERS_EXCEEDED, summary),
        )


def _commit_event_id(event: str, summary: RunSummary) -> uuid.UUID:
    """The id of a commit's event: the same for every process that commits the same run
    to the same output (two identical commands at once both end ``complete``, and each
    sent the event), so the Prefect server stores it once and automations act once (it
    drops an event id it has seen: ``prefect.server.events`` storage and causal ordering).
    A new generation of the run (its dead letters retried,
    docs/reference/output-layout.md, "Generations") is a new commit."""
    seed = json.dumps([event, summary.run_key, str(summary.output), summary.generation])
    return uuid.uuid5(uuid.NAMESPACE_URL, seed)


def dead_letters_threshold() -> int | None:
    """The Prefect Variable ``embedline_dead_letters_alert_threshold`` as rows, or None when
    it is unset, not a whole number ≥ 0, or cannot be read (an alert threshold never fails
    a committed run)."""
    from prefect.variables import Variable

    if not _api_configured():
        return None
    try:
        value = Variable.get(THRESHOLD_VARIABLE, default=None)
        threshold: int | None = None if value is None else int(value)
    except Exception:  # noqa: BLE001 - the API went away after the commit, a bad value
        return None
    return threshold if threshold is not None and threshold >= 0 else None


def emit_load_completed(summary: LoadSummary) -> None:
    """Emit ``embedline.load.completed`` for ``summary`` (a load that ended with exit 0)."""
    if not _api_configured():
        return
    _emit(
        LOAD_COMPLETED,
        f"embedline.run.{summary.run_key}",
        load_payload(summary),
        {"embedline.sink": str(summary.sink)},
    )


def _api_configured() -> bool:
    # Without PREFECT_API_URL, Prefect's client would start an ephemeral server (and a
    # database in ~/.prefect) just to drop the event: a CLI commit without a flow run.
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())


def _emit(
    event: str,
    resource_id: str,
    payload: dict[str, Any],
    labels: dict[str, str],
    *,
    event_id: uuid.UUID | None = None,
) -> None:
    from prefect.events import emit_event

    # Never fails the run: the events worker sends in the background and drops on error.
    emit_event(
        event=event,
        resource={"prefect.resource.id": resource_id, **labels},
        payload=payload,
        id=event_id,
    )
