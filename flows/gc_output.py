"""The ``gc-output`` flow: ``embedline gc`` as a Prefect flow, for a scheduled deployment.

Orchestration only; the policy and the deleting live in ``tasks/gc/retention.py``. Parameters mirror
the CLI (ages as text: ``90d``, ``24h``). The run's data is what was (or would be) deleted:
counts and bytes per kind of object, also published as the ``embedline-gc`` artifact.
"""

from __future__ import annotations

import os
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from adapters.ledger import Ledger
from adapters.object_store import open_store
from embedline.tracebacks import quiet_expected_tracebacks
from tasks.gc.retention import GcPlan, collect, parse_age, plan_gc

__all__ = ["gc_output"]


@task(name="plan-gc", cache_policy=NO_CACHE)
def _plan(output: str, keep_runs: int | None, older_than: str | None, grace: str) -> GcPlan:
    return plan_gc(
        open_store(output),
        keep_runs=keep_runs,
        older_than_s=None if older_than is None else parse_age(older_than),
        grace_s=parse_age(grace),
    )


@task(name="collect-garbage", cache_policy=NO_CACHE)
def _collect(output: str, plan: GcPlan, grace: str, ledger: str) -> GcPlan:
    book = Ledger(ledger) if os.path.exists(ledger) else None
    try:
        return collect(open_store(output), plan, ledger=book, grace_s=parse_age(grace))
    finally:
        if book is not None:
            book.close()


@flow(name="gc-output", log_prints=False)
def gc_output(
    output: str = "./embedline-output",
    keep_runs: int | None = None,
    older_than: str | None = None,
    grace: str = "24h",
    dry_run: bool = False,
    ledger: str = ".embedline/ledger.sqlite3",
) -> dict[str, Any]:
    """Delete manifests beyond retention and objects no kept manifest references.

    :raises ValueError: an age is not like ``90d``/``24h``/``2w``.
    """
    quiet_expected_tracebacks()  # an unreachable store is a line, not a traceback
    logger = get_run_logger()
    plan = _plan(output, keep_runs, older_than, grace)
    done = plan if dry_run else _collect(output, plan, grace, ledger)
    objects, size = done.totals()
    verb = "would delete" if dry_run else "deleted"
    logger.info(
        "%s: kept %d runs, %s %d objects (%d bytes)",
        output,
        len(done.kept_runs),
        verb,
        objects,
        size,
    )
    report = {
        kind: {"objects": len(items), "bytes": sum(i.size_bytes for i in items)}
        for kind, items in done.groups().items()
    }
    rows = "\n".join(f"| {k} | {v['objects']:,} | {v['bytes']:,} |" for k, v in report.items())
    datasets = [
        {
            **{k: v for k, v in d.fields.items() if v is not None},
            "kept": len(d.kept),
            "deleted": len(d.deleted),
        }
        for d in done.datasets
    ]
    for entry in done.datasets:
        logger.info(
            "dataset %s: kept %d runs, %s %d",
            entry.label(),
            len(entry.kept),
            verb,
            len(entry.deleted),
        )
    per_dataset = "\n".join(
        f"| {d.label()} | {len(d.kept)} | {len(d.deleted)} |" for d in done.datasets
    )
    create_markdown_artifact(
        f"# embedline gc ({verb})\n\n`{output}`: kept {len(done.kept_runs)} runs\n\n"
        f"| kind | objects | bytes |\n|---|---|---|\n{rows}\n\n"
        f"| dataset | runs kept | runs {verb} |\n|---|---|---|\n{per_dataset}\n",
        key="embedline-gc",
        description=f"embedline gc {verb} {objects} objects",
    )
    return {
        "dry_run": dry_run,
        "kept_runs": done.kept_runs,
        "deleted": report,
        "datasets": datasets,
        "temp_files": len(done.temp_files),
    }
