"""The ``embed-csv`` flow: plan → record → skip published → embed + publish → commit → load.

Orchestration only: the flow checks its parameters and the API key, then runs the stages in
order (``flows.run_stages``), each a method of ``flows.run.Run`` (no Prefect) or a stage
module (``flows.embed_and_publish``, ``flows.load``). Parameters are ``embedline run``'s
options in sections (``embedline.parameters``; docs/reference/cli.md) and never include a
secret: the API key stays in the environment (or a Secret block: ``flows.api_key``). The
flow's final state is Completed when the manifest is committed (or already was), Failed
otherwise; its data is the run summary, whose ``exit_code`` the CLI returns.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.states import Completed, Failed
from pydantic import ValidationError

from adapters.embeddings import api_key_from_env
from embedline.errors import EmbedlineError
from embedline.parameters import (
    BatchModeParameters,
    DestinationParameters,
    EmbeddingParameters,
    LimitParameters,
    SourceParameters,
    flattened,
)
from embedline.reachable import prefect_api_problem
from embedline.settings import (
    NO_API_KEY_MESSAGE,
    RunSettings,
    options_without_their_mode,
    remote_dask,
    validation_message,
)
from embedline.shutdown import STOP
from embedline.summary import RunSummary
from embedline.tracebacks import quiet_expected_tracebacks
from flows import cancellation
from flows.api_key import export_api_key_from_block
from flows.dask_address import dask_address_problem
from flows.run import Run
from flows.run_stages import run_settings
from flows.signals import under_prefect_runner

__all__ = ["embed_csv"]


@flow(name="embed-csv", log_prints=False)
def embed_csv(
    source: SourceParameters,
    embedding: EmbeddingParameters = EmbeddingParameters(),
    limits: LimitParameters = LimitParameters(),
    destination: DestinationParameters = DestinationParameters(),
    batch_mode: BatchModeParameters = BatchModeParameters(),
) -> State[Any]:
    """Embed the ``text_column`` of the CSV at ``input`` and publish it under ``output``.

    The parameters are ``embedline run``'s options in five sections
    (``embedline.parameters``, defaults from ``RunSettings``), each field named as the
    option (``--chunk-size`` is ``limits.chunk_size``).

    Args:
        source: Input: the CSV (input: a path relative to the working directory, or an
            absolute path), its id and text columns or a text template, kept columns,
            encoding, delimiter, quoting, Unicode normalization.
        embedding: Embedder: local or openai, model, base URL, dimensions, what is sent
            and reused.
        limits: Limits: rows per chunk and per request, requests in flight, rpm/tpm,
            timeouts, retries, cost cap and dry run, task runner.
        destination: Output and sink: output location, ledger, a sink to load after the
            commit, what may commit.
        batch_mode: Batch mode: the openai embedder's requests through the Batch API.

    ``text_template`` builds the text from several columns instead (``{column}``
    placeholders, ``{{``/``}}`` literal braces, e.g. ``"{title}\\n\\n{text}"``);
    ``keep_columns`` (names) are carried beside the vectors into chunk objects, readers and
    sinks, and ``keep_text`` keeps the text as column ``text`` (docs/reference/keys.md,
    output-layout.md, sinks.md). ``quoting`` ``none`` splits fields on the delimiter only
    (quotes kept); ``normalize`` ``NFC``/``NFKC`` puts each text in that Unicode form before
    it is hashed and sent (``none``: as read; docs/reference/cli.md, "Input").

    With ``sink``, the committed run is then loaded into that vector store (``load-chunk``
    tasks; docs/reference/sinks.md); ``max_delete_fraction``: docs/reference/output-layout.md,
    "Mass deletes at commit"; ``index`` ``later``: the sink's index is not built after the
    load (``embedline index TARGET`` builds it; the summary says so). Units:
    ``chunk_size``/``batch_size`` rows, ``concurrency`` in-flight requests, ``rpm``
    requests/min, ``tpm`` tokens/min, ``timeout`` seconds per request, ``max_attempts`` per
    request (first try included). Returns a Completed or
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
    parameters = flattened(
        dict(
            source=source,
            embedding=embedding,
            limits=limits,
            destination=destination,
            batch_mode=batch_mode,
        )
    )
    quiet_expected_tracebacks()
    reword_run_logs()
    ignored = options_without_their_mode(parameters)
    if ignored:  # refused, not ignored
        name, mode, on, _ = ignored[0]
        value = json.dumps(on) if isinstance(on, bool) else on
        return _final(
            Run.refused(
                2,
                "input_error",
                f"invalid parameters: {name} needs {mode}: {value} (only that mode reads it)",
            )
        )
    try:
        settings = RunSettings.from_parameters(parameters)
    except ValidationError as exc:
        return _final(
            Run.refused(2, "input_error", f"invalid parameters: {validation_message(exc)}")
        )
    problem = _cluster_problem(settings)
    if problem:
        return _final(Run.refused(2, "input_error", problem))
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


#: The module this flow is imported as when its tasks can run on other machines.
_MODULE = "flows.embed_csv"


def _cluster_problem(settings: RunSettings) -> str | None:
    """Why this flow cannot send its chunk tasks to a Dask cluster on other machines, or
    None; the CLI checks the same before Prefect starts, a deployment's flow run here.

    - Prefect loads a deployment's file entrypoint (``flows/embed_csv.py:embed_csv``) as a
      module named after the file (``embed_csv``), and the tasks it sends refer to that
      module, which the scheduler and the workers cannot import (every chunk would fail
      there with ``No module named 'embed_csv'``).
    - The workers report to this flow's Prefect API: on loopback they cannot reach it
      (``embedline.reachable.prefect_api_problem``).
    - A scheduler by address must answer there (``flows.dask_address``): a wrong one failed
      the flow run after Dask's 30 s connect timeout, with its tracebacks.
    """
    if settings.task_runner != "dask" or not remote_dask(settings):
        return None
    if __name__ != _MODULE:
        return (
            f"this flow was loaded from its file as module {__name__!r}, which a Dask cluster "
            "on other machines cannot import: deploy it with the entrypoint "
            f"{_MODULE}.embed_csv (as embedline deployment writes it)"
        )
    from prefect.settings import get_current_settings

    api_url = get_current_settings().api.url
    if settings.dask_address and STOP.run_by_command():  # asked before Prefect started
        return None
    if settings.dask_address:  # a deployment's flow run: named as its parameter
        return dask_address_problem(settings.dask_address, api_url, option="limits.dask_address")
    problem = prefect_api_problem(api_url, scheduler_host="")
    return problem and f"--dask-cluster-class {settings.dask_cluster_class}: {problem}"


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


class RunNotComplete(EmbedlineError):
    """The data of a Failed ``embed-csv`` state: carries the run summary (``.summary``).

    An exception, not a dict, because Prefect's engine re-raises a failed flow run's data;
    a dict there becomes ``TypeError: Unexpected result for failed state`` in worker logs.
    An ``EmbedlineError``: the engine logs that re-raise ("Engine execution exited with
    unexpected exception") on the flow run's logger, and the run's expected end then shows
    its one line without a traceback (``embedline.tracebacks``), not 40 lines after it.
    """

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(summary["message"])
        self.summary = summary


#: What a deployment's flow run says for the CLI's "rerun the same command": it has no
#: command; the UI's Retry on the flow run (or ``prefect flow-run retry ID``) runs it again
#: with its parameters, and resumes as a rerun does.
_RERUN = "rerun the same command"
_RETRY = "run it again (Retry on the flow run's page in the UI)"


def for_this_process(message: str) -> str:
    """``message`` as the one who reads it can act on it: in a flow run a Prefect worker or
    ``serve`` started (``flows.signals.under_prefect_runner``), "rerun the same command"
    becomes a retry of the flow run; elsewhere (the CLI) it is unchanged."""
    return message.replace(_RERUN, _RETRY) if under_prefect_runner() else message


class _ForThisProcess(logging.Filter):
    """Rewords the run's log lines as ``for_this_process`` does its final message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _RERUN in message:
            record.msg, record.args = for_this_process(message), ()
        return True


_REWORD = _ForThisProcess()


def reword_run_logs() -> None:
    """In a flow run a Prefect worker or ``serve`` started, the lines the flow and its tasks
    log through Prefect's run loggers (``prefect.flow_runs``, ``prefect.task_runs``: the
    flow run's page) say what to do there too (``for_this_process``); idempotent, and
    nothing in the CLI's own process."""
    if not under_prefect_runner():
        return
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if _REWORD not in logger.filters:
            logger.addFilter(_REWORD)


def _final(summary: RunSummary) -> State[Any]:
    summary.message = for_this_process(summary.message)
    if summary.exit_code == 0:
        cancellation.complete_despite_cancel()  # a cancel after the commit stopped nothing
        return Completed(message=summary.message or summary.status, data=summary.to_dict())
    failed: State[Any] = Failed(message=summary.message, data=RunNotComplete(summary.to_dict()))
    return cancellation.cancelled_or(failed)  # Cancelled if Prefect cancelled the run
