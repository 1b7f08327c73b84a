"""Planning stage (flow process): plan the input (the ``plan-input`` task)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from adapters.csv_source import plan_csv
from embedline.models import InputPlan
from embedline.settings import RunSettings

__all__ = ["plan_input"]


@task(name="plan-input", cache_policy=NO_CACHE)
def plan_input(settings: RunSettings, handed: InputPlan | None = None) -> InputPlan:
    """Stream the input once: hash, count, validate and cut it into chunks; or take
    ``handed``, the plan ``embedline run`` made of the same file moments ago
    (``flows.session``; pass it in ``prefect.utilities.annotations.quote``: Prefect then
    does not walk it as a task input).

    :raises InputError: anything wrong with the file (exit 2), before any API call.
    """
    logger = get_run_logger()
    plan = handed if handed is not None else plan_csv(settings.input, **settings.plan_arguments)
    if plan.source.note:
        logger.info("read %s as: %s", plan.source.name, plan.source.note)
    logger.info(
        "planned %s: %d rows, %d bytes, %d chunks of up to %d rows",
        plan.source.name,
        plan.rows,
        plan.bytes,
        len(plan.chunks),
        settings.chunk_size,
    )
    return plan
