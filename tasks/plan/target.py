"""Which run a command works on: a run, or the next generation of a committed one.

A committed run is final under its run key, but committing the same input again is sometimes
what the command asks (docs/reference/output-layout.md, "Generations"): its dead letters of
kind ``rejected``, ``too_long`` or ``server_error`` are to be retried; a later run of its
dataset committed since (its input is the current one again: an export reverted, or re-sent);
``--compact`` asks for whole objects and the run inherits objects with dropped rows. That
commits a new run, *generation* N+1, whose run key is the same inputs plus ``g{N+1}``
(``keys.run_key(..., generation=N+1)``) and whose manifest says ``supersedes``: every reader,
sink and ``gc`` treats it as the next committed run over the same input, and no object is
ever overwritten. No Prefect here: ``embedline run`` asks before starting it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from embedline import keys
from embedline.models import RETRYABLE_DEAD_LETTERS, InputPlan
from embedline.protocols import ObjectStore
from embedline.settings import RunSettings
from tasks.commit.manifest import dataset_key, latest_manifest, read_manifest

__all__ = ["REASONS", "RunTarget", "resolve_run_target", "retries_committed"]


@dataclass(frozen=True, slots=True)
class RunTarget:
    """The run a command works on.

    ``committed`` is the manifest of ``run_key`` when it is already committed (nothing to
    do); otherwise the run is to be embedded and committed as ``generation``, superseding
    the committed run ``supersedes`` (None for generation 0), for ``reason``: one of
    ``REASONS`` (empty for generation 0).
    """

    run_key: str
    generation: int = 0
    supersedes: str | None = None
    committed: dict[str, Any] | None = None
    reason: str = ""


#: Why a committed run's next generation is committed, as ``RunTarget.reason``.
REASONS: Mapping[str, str] = MappingProxyType(
    {
        "dead_letters": "its dead letters are retried",
        "overtaken": "a later run of its dataset is committed: its input is the current one again",
        "compact": "--compact: its objects hold dropped rows",
    }
)


def retries_committed(manifest: dict[str, Any], settings: RunSettings) -> bool:
    """Should this command retry the dead letters of a committed run
    (docs/reference/output-layout.md, "Generations")?

    Only when the manifest has dead letters of a retryable kind (a manifest without the
    ``dead_letters`` counts: any failed row), and ``--retry-dead-letters`` is set or the
    request settings differ from those the manifest recorded.
    """
    counts = manifest.get("dead_letters")
    if counts is None:
        retryable = int(manifest.get("rows_failed", 0)) > 0
    else:
        retryable = any(n for reason, n in counts.items() if reason in RETRYABLE_DEAD_LETTERS)
    if not retryable:
        return False
    recorded = manifest.get("request_settings")
    return settings.retry_dead_letters or (
        bool(recorded) and recorded != settings.request_fingerprint
    )


def resolve_run_target(store: ObjectStore, plan: InputPlan, settings: RunSettings) -> RunTarget:
    """Find the newest committed generation of the run for ``plan`` and ``settings``, then
    decide: nothing to do (``committed``), commit it again as the next generation (for one
    of ``REASONS``), or run it.

    Costs one GET per committed generation plus one for the first missing one (at least
    two: a first run's generation 0 and 1; generation 0 may be gone to ``gc``); for a
    committed run, a LIST of ``manifests/`` and a GET of each (``latest_manifest``).

    :raises ConflictError: an object at a manifest key is not a manifest.
    """
    key_for = _key_function(plan, settings)
    generation, newest = _newest_committed(store, key_for)
    if newest is None:
        return RunTarget(key_for(0))
    reason = _recommit_reason(store, newest, settings)
    if not reason:
        return RunTarget(key_for(generation), generation, committed=newest)
    return RunTarget(
        key_for(generation + 1), generation + 1, supersedes=key_for(generation), reason=reason
    )


def _recommit_reason(store: ObjectStore, manifest: dict[str, Any], settings: RunSettings) -> str:
    """Why the committed run ``manifest`` is to be committed again (a key of ``REASONS``),
    or "" (it is what the command asks for: nothing to do)."""
    if retries_committed(manifest, settings):
        return "dead_letters"
    latest = latest_manifest(store, dataset=dataset_key(manifest))
    if latest is not None and latest["run_key"] != manifest["run_key"]:
        return "overtaken"
    if settings.compact and any(entry.get("drop_ids") for entry in manifest["chunks"]):
        return "compact"
    return ""


def _key_function(plan: InputPlan, settings: RunSettings) -> Callable[[int], str]:
    def key_for(generation: int) -> str:
        return keys.run_key(
            plan.sha256,
            settings.id_column,
            settings.text_column,
            settings.effective_model,
            settings.dimensions,
            settings.chunk_size,
            generation=generation,
            columns=plan.source.key_lines,
        )

    return key_for


def _newest_committed(
    store: ObjectStore, key_for: Callable[[int], str]
) -> tuple[int, dict[str, Any] | None]:
    """(generation, manifest) of the newest committed generation, or (0, None)."""
    found: tuple[int, dict[str, Any] | None] = (0, read_manifest(store, key_for(0)))
    generation = 1
    while (manifest := read_manifest(store, key_for(generation))) is not None:
        found = (generation, manifest)
        generation += 1
    return found
