"""The ``embed-csv`` flow: plan → record → skip published → embed + publish → commit → load.

Orchestration only: the flow checks its parameters and the API key, then runs the stages in
order (``flows.run_stages``), each a method of ``flows.run.Run`` (no Prefect) or a stage
module (``flows.embed_and_publish``, ``flows.load``). Parameters mirror ``embedline run``
(docs/reference/cli.md) and never include a secret: the API key stays in the environment
(or a Secret block: ``flows.api_key``). The flow's final state is Completed when the
manifest is committed (or already was), Failed otherwise; its data is the run summary, whose
``exit_code`` the CLI returns.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.states import Completed, Failed
from pydantic import ValidationError

from adapters.embeddings import api_key_from_env
from embedline.models import RunSummary
from embedline.settings import (
    NO_API_KEY_MESSAGE,
    RunSettings,
    batch_options_without_batch_api,
    validation_message,
)
from embedline.shutdown import STOP
from embedline.tracebacks import quiet_expected_tracebacks
from flows import cancellation
from flows.api_key import export_api_key_from_block
from flows.run import Run
from flows.run_stages import run_settings

__all__ = ["embed_csv"]


@flow(name="embed-csv", log_prints=False)
def embed_csv(
    input: str,
    output: str = "./embedline-output",
    id_column: str = "id",
    text_column: str = "text",
    text_template: str | None = None,
    keep_columns: list[str] | None = None,
    keep_text: bool = False,
    encoding: str = "auto",
    delimiter: str = "auto",
    quoting: Literal["minimal", "none"] = "minimal",
    normalize: Literal["none", "NFC", "NFKC"] = "none",
    embedder: Literal["local", "openai"] = "local",
    model: str | None = None,
    base_url: str = "https://api.openai.com/v1",
    dimensions: int | None = None,
    chunk_size: int = 1000,
    batch_size: int = 1000,
    max_request_tokens: int = 200_000,
    concurrency: int = 8,
    rpm: int | None = None,
    tpm: int | None = None,
    timeout: float = 60.0,
    max_attempts: int = 6,
    max_input_tokens: int | None = None,
    on_too_long: Literal["dead-letter", "truncate"] = "dead-letter",
    auth_header: str | None = None,
    encoding_format: Literal["auto", "base64", "float"] = "auto",
    chunk_retries: int = 1,
    chunk_retry_delay: float = 10.0,
    grace: float = 30.0,
    wait_for_live_run: float = 3600.0,
    ledger: str = ".embedline/ledger.sqlite3",
    allow_failed_rows: bool = False,
    on_empty_text: Literal["skip", "fail"] = "skip",
    retry_dead_letters: bool = False,
    allow_unconditional_store: bool = False,
    price_per_million_tokens: float | None = None,
    max_cost: float | None = None,
    dry_run: bool = False,
    reuse: bool = True,
    compact: bool = False,
    task_runner: Literal["threads", "dask"] = "threads",
    dask_address: str | None = None,
    dask_workers: int = 2,
    sink: str | None = None,
    max_delete_fraction: float = 0.5,
    batch_api: bool = False,
    batch_poll_interval: float | None = None,
    batch_max_inputs: int | None = None,
    batch_fallback: Literal["batch", "sync"] | None = None,
    batch_enqueued_tokens: int | None = None,
) -> State[Any]:
    """Embed the ``text_column`` of the CSV at ``input`` and publish it under ``output``.

    ``text_template`` builds the text from several columns instead (``{column}``
    placeholders, ``{{``/``}}`` literal braces, e.g. ``"{title}\n\n{text}"``);
    ``keep_columns`` (names) are carried beside the vectors into chunk objects, readers and
    sinks, and ``keep_text`` keeps the text as column ``text`` (docs/reference/keys.md,
    output-layout.md, sinks.md). ``quoting`` ``none`` splits fields on the delimiter only
    (quotes kept); ``normalize`` ``NFC``/``NFKC`` puts each text in that Unicode form before
    it is hashed and sent (``none``: as read; docs/reference/cli.md, "Input").

    With ``sink``, the committed run is then loaded into that vector store (``load-chunk``
    tasks; docs/reference/sinks.md); ``max_delete_fraction``: docs/reference/output-layout.md,
    "Mass deletes at commit". Units: ``chunk_size``/``batch_size`` rows, ``concurrency``
    in-flight requests, ``rpm`` requests/min, ``tpm`` tokens/min, ``timeout`` seconds per
    request, ``max_attempts`` per request (first try included). Returns a Completed or
    Failed state carrying the summary (Cancelled if cancelled from Prefect:
    ``flows.cancellation``).

    ``batch_api`` (openai embedder): the requests go through the provider's Batch API at half
    price (``flows.batch_stage``), polled every ``batch_poll_interval`` seconds at most (None:
    60), at most ``batch_max_inputs`` inputs per batch (None: 50,000); ``batch_fallback``
    ``sync`` sends what batches left unanswered synchronously (None: ``batch``);
    ``batch_enqueued_tokens`` sizes batches to the account's enqueued-token budget
    (estimated tokens). Any of these four set without ``batch_api`` is refused (exit 2),
    not ignored.

    ``wait_for_live_run`` (seconds): how long the run waits for an earlier live run on its
    output that may send texts it would copy, before it steps aside (exit 75, nothing
    published: ``tasks.lease.overlap``).

    ``dry_run``: no request, no write, no run recorded: the run's estimate (rows, new texts,
    estimated tokens, cost at ``price_per_million_tokens``: ``flows.estimate``) is the
    Completed state's data and the ``embedline-estimate`` artifact. ``max_cost`` (USD, with
    ``price_per_million_tokens``): stop before a request would take the spend above it
    (exit 3; ``adapters.embeddings.spend``).
    """
    parameters = dict(locals())
    quiet_expected_tracebacks()
    ignored = batch_options_without_batch_api(parameters)
    if ignored:  # refused, not ignored
        return _final(
            Run.refused(
                2,
                "input_error",
                (
                    f"invalid parameters: {ignored[0]} needs batch_api: true "
                    "(only the Batch API mode reads it)"
                ),
            )
        )
    try:
        settings = RunSettings.from_parameters(parameters)
    except ValidationError as exc:
        return _final(
            Run.refused(2, "input_error", f"invalid parameters: {validation_message(exc)}")
        )
    if settings.dry_run:  # nothing sent: no API key needed
        return _dry_run(settings)
    problem = _api_key_problem(settings)
    if problem:
        return _final(Run.refused(3, "fatal", problem))
    summary = cancellation.run_stopping_on_cancel(lambda: run_settings(settings))
    if isinstance(summary, State):  # cancelled from Prefect before the run had a summary
        return summary
    cancellation.end_as_runner_cancellation(summary.message)
    # The Prefect API went away: the CLI prints this and exits (not 1 min of client retries)
    STOP.report.hand_over(summary.to_dict())
    return _final(summary)


def _dry_run(settings: RunSettings) -> State[Any]:
    """The run's estimate (``flows.estimate``): logged, the ``embedline-estimate``
    artifact, the Completed state's data; a run that cannot start fails as it would."""
    from prefect.artifacts import create_markdown_artifact

    from adapters.csv_source import plan_csv
    from flows.estimate import estimate_run
    from tasks.embed.task import store_for

    logger = get_run_logger()
    estimate = estimate_run(
        settings,
        store=store_for(settings.output),
        plan_input=lambda s: plan_csv(s.input, **s.plan_arguments),
        log=logger,
    )
    if isinstance(estimate, tuple):
        return _final(Run.refused(estimate[1], "input_error", estimate[0]))
    for line in estimate.lines():
        logger.info("%s", line)
    create_markdown_artifact(
        estimate.markdown(), key="embedline-estimate", description="embedline dry run"
    )
    return Completed(message=estimate.lines()[0], data=estimate.to_dict())


def _api_key_problem(settings: RunSettings) -> str | None:
    """Why the openai embedder has no key (none in the environment, none in the Secret
    block ``flows.api_key`` reads), or None."""
    if settings.embedder != "openai" or api_key_from_env() is not None:
        return None
    try:
        if export_api_key_from_block():
            get_run_logger().info("API key loaded from a Secret block")
    except ValueError as exc:
        return str(exc)
    if settings.requires_api_key and api_key_from_env() is None:
        return NO_API_KEY_MESSAGE
    return None


class RunNotComplete(Exception):
    """The data of a Failed ``embed-csv`` state: carries the run summary (``.summary``).

    An exception, not a dict, because Prefect's engine re-raises a failed flow run's data;
    a dict there becomes ``TypeError: Unexpected result for failed state`` in worker logs.
    """

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(summary["message"])
        self.summary = summary


def _final(summary: RunSummary) -> State[Any]:
    if summary.exit_code == 0:
        cancellation.complete_despite_cancel()  # a cancel after the commit stopped nothing
        return Completed(message=summary.message or summary.status, data=summary.to_dict())
    failed: State[Any] = Failed(message=summary.message, data=RunNotComplete(summary.to_dict()))
    return cancellation.cancelled_or(failed)  # Cancelled if Prefect cancelled the run
