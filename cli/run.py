"""``embedline run`` and ``embedline retry-failed``: plan, then call the ``embed-csv`` flow.
Checks that need no Prefect answer before it starts; so does a run with nothing to send."""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
from typing import TYPE_CHECKING, Any

from cli.arguments import (DEFAULT_LEDGER, HELP_FORMATTER, LEDGER_HELP, MAX_DELETE_HELP,
                           fraction, non_negative_float, non_negative_int, positive_float,
                           positive_int, usage_line)
from cli.failures import EXIT_FATAL, EXIT_USAGE, exit_on_api_loss, fail
from cli.ledger_lookup import check_ledger, find_run, open_ledger
from cli.prefect_console import quiet_prefect_signal_crashes
from cli.prefect_env import PrefectApi, PrefectApiError, with_prefect_api
from embedline.interrupts import SIGNALS, exit_code_for
from embedline.shutdown import STOP
from embedline.tracebacks import DEBUG_ENV

if TYPE_CHECKING:  # imported when used: `embedline --help` stays fast
    from cli.plan_ahead import PlanAhead
    from embedline.settings import RunSettings
    from flows.run import Run

__all__ = ["add_parsers"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``run`` and ``retry-failed``."""
    run = sub.add_parser("run", help="embed INPUT and publish chunks, then the manifest",
                         formatter_class=HELP_FORMATTER)
    run.add_argument("input", metavar="INPUT", help="CSV file with an id and a text column")
    run.add_argument("--output", default="./embedline-output",
                     help="local directory, file:// URI or s3://bucket/prefix")
    run.add_argument("--id-column", default="id", help="header name of the unique id column")
    run.add_argument("--text-column", default="text",
                     help="header name of the column to embed")
    run.add_argument("--text-template", default=None, metavar="TEMPLATE", type=_template_arg,
                     help="build the text to embed from several columns: {column} "
                          "placeholders, {{ }} for literal braces, \\n and \\t understood, "
                          "e.g. '{title}\\n\\n{text}' (instead of --text-column)")
    run.add_argument("--keep-columns", default=None, metavar="A,B",
                     help="columns carried beside the vectors, as read, into chunk objects, "
                          "read_embeddings and sinks (comma-separated header names)")
    run.add_argument("--keep-text", action="store_true",
                     help="keep the embedded text itself as column 'text' beside the vectors")
    run.add_argument("--encoding", default="auto",
                     help="auto (UTF-8 with or without BOM, UTF-16 by its BOM, else detected "
                          "and printed; a single-byte code page such as cp1252 must be "
                          "named: auto refuses to guess it) or a codec name such as cp932, "
                          "cp1252, utf-16-le")
    run.add_argument("--delimiter", default="auto",
                     help="field separator: auto (found in the header line among , ; tab |) "
                          "or one character; 'tab' for tab")
    run.add_argument("--embedder", choices=("local", "openai"), default="local",
                     help="local: all-MiniLM-L6-v2 in-process; openai: any OpenAI-compatible "
                          "API (key from EMBEDLINE_API_KEY or OPENAI_API_KEY)")
    run.add_argument("--model", default=None,
                     help="the embedder's model (default: all-MiniLM-L6-v2 for local, "
                          "text-embedding-3-small for openai)")
    run.add_argument("--base-url", default="https://api.openai.com/v1",
                     help="OpenAI-compatible API root; POST {base-url}/embeddings")
    run.add_argument("--dimensions", type=positive_int, default=None,
                     help="shortened vectors (openai text-embedding-3) (default: the model's own)")
    run.add_argument("--chunk-size", type=positive_int, default=1000, help="rows per chunk")
    run.add_argument("--batch-size", type=positive_int, default=1000,
                     help="rows per request (at most 2048, OpenAI's limit)")
    run.add_argument("--max-request-tokens", type=positive_int, default=200_000,
                     help="estimated tokens per request (OpenAI allows 300,000)")
    run.add_argument("--concurrency", type=positive_int, default=8,
                     help="embedding requests in flight across the process")
    run.add_argument("--rpm", type=positive_int, default=None,
                     help="requests per minute (default: no limit: the server's 429s and "
                          "Retry-After pace the run)")
    run.add_argument("--tpm", type=positive_int, default=None,
                     help="tokens per minute (default: no limit)")
    run.add_argument("--timeout", type=positive_float, default=60.0,
                     help="seconds per request")
    run.add_argument("--max-attempts", type=positive_int, default=6,
                     help="attempts per request, the first included")
    run.add_argument("--max-input-tokens", type=positive_int, default=None,
                     help="the model's limit per text, e.g. 8191 for text-embedding-3 "
                          "(openai); longer texts follow --on-too-long (default: unset: the "
                          "server's 400 isolates them)")
    run.add_argument("--on-too-long", choices=("dead-letter", "truncate"), default="dead-letter",
                     help="what to do with a text over --max-input-tokens")
    run.add_argument("--auth-header", default=None, metavar="NAME",
                     help="header that carries the API key: Authorization (sent as "
                          "'Bearer KEY') or e.g. api-key for Azure-style gateways (sent as "
                          "the bare key) (default: $EMBEDLINE_AUTH_HEADER, else Authorization)")
    run.add_argument("--encoding-format", choices=("auto", "base64", "float"), default="auto",
                     help="how vectors travel: auto asks for base64 and falls back "
                          "to float for the whole run if the server refuses base64")
    run.add_argument("--chunk-retries", type=non_negative_int, default=1,
                     help="Prefect retries of a chunk after a retryable failure")
    run.add_argument("--chunk-retry-delay", type=non_negative_float, default=10.0,
                     help="seconds between Prefect retries of a chunk")
    run.add_argument("--grace", type=non_negative_float, default=30.0,
                     help="seconds in-flight chunks may finish after SIGINT/SIGTERM")
    run.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    run.add_argument("--retry-dead-letters", action="store_true",
                     help="send again the rows of published chunks that are dead letters of "
                          "kind rejected, too_long or server_error (never empty texts); the "
                          "chunk is superseded by a new object, none is overwritten")
    run.add_argument("--allow-failed-rows", action="store_true",
                     help="commit the manifest even if some rows are dead letters")
    run.add_argument("--on-empty-text", choices=("skip", "fail"), default="skip",
                     help="empty or whitespace-only texts are never sent: skip lists them as "
                          "empty_text dead letters and commits; fail keeps the manifest "
                          "uncommitted unless --allow-failed-rows (exit 1)")
    run.add_argument("--allow-unconditional-store", action="store_true",
                     help="run even if the store ignores conditional writes (unsafe)")
    run.add_argument("--price-per-million-tokens", type=non_negative_float, default=None,
                     help="USD per 1M tokens, for the cost estimate in the summary (default: no "
                          "estimate)")
    run.add_argument("--no-reuse", dest="reuse", action="store_false",
                     default=argparse.SUPPRESS,  # not "(default: True)": reuse is on
                     help="send every text, even one whose vector the output already holds "
                          "for this model (e.g. the model's weights changed under its name); "
                          "without it, such texts are reused, not sent (default: off: reuse is on)")
    run.add_argument("--task-runner", choices=("threads", "dask"), default="threads",
                     help="where chunk tasks run: threads here, or Dask workers (with no "
                          "PREFECT_API_URL they use this run's temporary Prefect server)")
    run.add_argument("--dask-address", default=None,
                     help="an existing Dask scheduler (tcp://host:8786); remote workers need an "
                          "s3:// --output (default: a local cluster)")
    run.add_argument("--dask-workers", type=positive_int, default=2,
                     help="worker processes of the local Dask cluster")
    run.add_argument("--sink", default=None, metavar="URI",
                     help="after the manifest commit, load the run into lancedb://PATH, "
                          "PATH/NAME.lance, postgresql://user@host/db, "
                          "qdrant://HOST:PORT/COLLECTION or qdrant+local://PATH (see embedline "
                          "load) (default: no load)")
    run.add_argument("--max-delete-fraction", type=fraction, default=0.5, metavar="SHARE",
                     help=MAX_DELETE_HELP)
    run.add_argument("--batch-api", action="store_true",
                     help="--embedder openai: send the requests as Batch API batches (half "
                          "the price, results within 24 h); the run waits for them, and a "
                          "rerun after a crash or Ctrl-C collects them without paying twice")
    # Read only with --batch-api, and refused without it (not ignored): absent from the
    # namespace unless given (SUPPRESS), so their help states the default itself
    run.add_argument("--batch-poll-interval", type=positive_float, default=argparse.SUPPRESS,
                     metavar="SECONDS",
                     help="with --batch-api: longest wait between two polls of the run's "
                          "batches (the first polls come sooner) (default: 60.0)")
    run.add_argument("--batch-max-inputs", type=positive_int, default=argparse.SUPPRESS,
                     metavar="N",
                     help="with --batch-api: inputs per batch (OpenAI allows 50,000) "
                          "(default: 50000)")
    run.add_argument("--batch-fallback", choices=("batch", "sync"), default=argparse.SUPPRESS,
                     help="with --batch-api: what batches leave unanswered (expired, "
                          "cancelled, server errors): sent again as a batch, or "
                          "synchronously at full price (default: batch)")
    run.add_argument("--batch-enqueued-tokens", type=positive_int, default=argparse.SUPPRESS,
                     metavar="N",
                     help="with --batch-api: the account's enqueued-token limit for the "
                          "model: batches are sized to fit it (default: 50,000 inputs per "
                          "batch; a refusal token_limit_exceeded waits for earlier batches)")
    run.add_argument("--progress-interval", type=non_negative_float, default=10.0,
                     metavar="SECONDS",
                     help="when stderr is not a terminal, a progress line every SECONDS "
                          "(0: none)")
    run.add_argument("--debug", action="store_true",
                     help="show tracebacks of expected failures (also in Dask workers)")
    run.set_defaults(handler=_run)
    retry = sub.add_parser(
        "retry-failed",
        help="rerun a run's failed and never-run chunks with its recorded settings",
        formatter_class=HELP_FORMATTER,
    )
    retry.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    retry.add_argument("--dead-letters", action="store_true",
                       help="also send again the run's dead letters of kind rejected, "
                            "too_long or server_error (only them; empty texts stay final)")
    retry.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    retry.add_argument("--debug", action="store_true", help="show tracebacks of expected failures")
    retry.set_defaults(handler=_retry_failed)


def _template_arg(text: str) -> str:
    """argparse type of ``--text-template``: ``\\n``, ``\\t`` (and ``\\\\``) become the
    characters a shell's single quotes cannot hold (``embedline.template.unescape_cli``)."""
    from embedline.template import unescape_cli

    return unescape_cli(text)


def _settings_from(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from embedline.settings import (
        RunSettings,
        batch_options_without_batch_api,
        validation_message,
    )

    parameters = {k: v for k, v in vars(args).items()
                  if k not in _CLI_ONLY}
    ignored = batch_options_without_batch_api(parameters)
    prog = f"embedline {args.command}"
    if ignored:  # before: silently ignored
        flag = "--" + ignored[0].replace("_", "-")
        raise SystemExit(fail(usage_line(prog, f"argument {flag}: needs --batch-api"),
                              EXIT_USAGE))
    try:
        return RunSettings.from_parameters(parameters)
    except ValidationError as exc:
        raise SystemExit(fail(usage_line(prog, f"argument {validation_message(exc)}"),
                              EXIT_USAGE)) from None


_CLI_ONLY = ("command", "handler", "debug", "progress_interval")  # not flow parameters


def _run(args: argparse.Namespace) -> int:
    _set_debug(args.debug)
    return _run_settings(_settings_from(args), progress_interval_s=args.progress_interval)


def _set_debug(debug: bool) -> None:
    """``--debug``: keep tracebacks of expected failures, here and in Dask workers (env)."""
    from embedline.tracebacks import DEBUG_ENV

    if debug:
        os.environ[DEBUG_ENV] = "1"


def _retry_failed(args: argparse.Namespace) -> int:
    """Rerun a recorded run: published chunks are skipped, the rest are embedded again."""
    _set_debug(args.debug)
    from pydantic import ValidationError

    from embedline.settings import RunSettings, validation_message

    ledger = open_ledger(args.ledger)
    run = find_run(ledger, args.run)
    recorded = ledger.run_settings(run.run_key)
    ledger.close()
    try:
        settings = RunSettings(**{**recorded, "ledger": args.ledger,
                                   "retry_dead_letters": bool(args.dead_letters)})
    except ValidationError as exc:
        return fail("embedline: error: the recorded settings no longer validate: "
                    f"{validation_message(exc)}", EXIT_USAGE)
    print(f"retrying run {run.run_key} ({run.input_name} -> {run.output_uri})", file=sys.stderr)
    return _run_settings(settings)


def _run_settings(settings: RunSettings, *, progress_interval_s: float = 10.0) -> int:
    from cli.plan_ahead import PlanAhead, prefect_on_demand

    lazy = prefect_on_demand(settings)  # else Prefect starts now, in parallel with planning
    ahead = None if lazy else PlanAhead.for_run(settings)  # first: the checks import it too
    try:
        problem = _check_before_prefect(settings)
        if problem is not None:
            return fail(f"embedline: error: {problem[0]}", problem[1])
        return with_prefect_api(
            lambda api: _run_flow(settings, api, progress_interval_s, ahead),
            on_lost=lambda loss: _stop_after_api_loss(loss, settings.grace_s), defer_server=lazy)
    finally:
        if ahead is not None:
            ahead.close()
        while _handed_leases:  # the flow took its own lease, and has ended
            _handed_leases.pop().close()


#: Seconds, beyond ``--grace``, that the flow gets to record its chunks and summary after
#: the Prefect API went away (ledger and store writes only: no API call).
_HAND_OVER_MARGIN_S = 10.0
#: Prefect's loggers that report each failed call to a lost API (an event dump per line).
_API_NOISE_LOGGERS = ("prefect.events.clients", "prefect._internal.concurrency")


def _stop_after_api_loss(loss: Any, grace_s: float) -> None:
    """Watchdog thread, the Prefect API gone mid-run: the flow stops dispatching (in-flight
    chunks get ``grace_s`` seconds), records every outcome in the ledger and hands its
    summary over; print it and one line, and exit with its code (1: rerun resumes) without
    waiting for Prefect's client retries. At most ``grace_s + _HAND_OVER_MARGIN_S`` seconds;
    none once only reporting is left (``STOP.report.committed().summary``): before, the API lost
    just after the commit waited 42 s and then said "rerun … to resume", exit 1."""
    import logging

    from cli.console import command_seconds, print_summary, stop_progress

    if not os.environ.get(DEBUG_ENV):
        for name in _API_NOISE_LOGGERS:
            logging.getLogger(name).disabled = True  # Prefect's SafeLogger ignores levels
    STOP.report.note_api_lost(loss)
    # Committed and nothing left but reporting: the flow's last steps are Prefect calls
    # that would retry for a minute; the summary is known
    committed = STOP.report.committed()
    summary = committed.summary if committed is not None else None
    if summary is None:
        summary = STOP.report.wait_for_hand_over(grace_s + _HAND_OVER_MARGIN_S)
    if summary is None:  # not dispatching yet, or stuck: the next run reclaims its chunks
        committed = STOP.report.committed()  # the flow may have committed while this waited
        if committed is None:
            exit_on_api_loss(loss)
        else:  # a sink's load was left: the rerun does only that
            exit_on_api_loss(loss, kept=f"run {committed.run_key[:12]} is committed",
                             todo=committed.todo)
        return
    code = int(summary["exit_code"])
    try:  # whatever printing does, this thread ends the process
        stop_progress()
        print_summary(summary, command_s=command_seconds())
        if summary.get("load"):
            from cli.load import print_load_summary

            print_load_summary(summary["load"])
        if code:
            sys.stderr.write(f"embedline: error: {summary['message']}\n")
        else:
            sys.stderr.write(f"embedline: warning: {loss.what} after the run completed; "
                             "this run is missing from the Prefect UI\n")
    finally:
        STOP.exit.hard_exit(code)


def _run_flow(settings: RunSettings, api: PrefectApi, progress_interval_s: float,
              ahead: PlanAhead | None) -> int:
    from cli.console import ProgressBar, command_seconds, print_summary

    if ahead is not None:  # imported while the child plans (cli/plan_ahead.py)
        _import_the_flow()
    # a commit's event goes to a server someone reads, never to the temporary one this
    # command stops at its end (Prefect's events worker waited for it, seconds and a line)
    committed = _without_prefect(settings, emit_events=api.server is None, ahead=ahead) \
        if "://" not in settings.input else None
    if isinstance(committed, tuple):
        return fail(f"embedline: error: {committed[0]}", committed[1])
    if committed is not None:
        from cli.load import already_loaded, print_load_summary

        loaded = settings.sink and already_loaded(
            settings.output, str(committed["run_key"]), settings.sink, settings.ledger,
            allow_failed_rows=settings.allow_failed_rows)
        if not settings.sink or loaded:
            print_summary(committed)
            if loaded:
                print_load_summary(loaded)
            _say_why_not_complete(committed)
            if loaded and loaded["exit_code"]:  # the load's dead letters, said again at once
                return int(loaded["exit_code"])
            return int(committed["exit_code"])  # 1: every chunk published, dead letters
        # with --sink and a load still to do, the flow loads the committed run
    api.start_server()
    embed_csv, raise_if_interrupted_by_cancel = _import_the_flow()
    if api.server is not None:
        _import_while_the_server_starts()
    try:
        api.wait_ready()
    except PrefectApiError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    parameters = settings.to_parameters()
    STOP.raise_lost_interrupt()  # a Ctrl-C that a library swallowed while it imported
    STOP.command_handles_signals()  # SIGTERM as SIGINT; held once committed
    quiet_prefect_signal_crashes()
    with ProgressBar(terminal=sys.stderr.isatty(), interval_s=progress_interval_s), \
            _no_heartbeats(api):
        state = embed_csv(**parameters, return_state=True)  # an interrupt: cli.main says it
    if _recorded_run_hook is not None:
        STOP.exit.remove_hard_exit_hook(_recorded_run_hook)
    summary = state.result(raise_on_failure=False)
    summary = getattr(summary, "summary", summary)  # a Failed state carries RunNotComplete
    raise_if_interrupted_by_cancel(summary)  # cancelled before a summary: cli.main says it
    if not isinstance(summary, dict):
        return fail(f"embedline: the flow ended in state {state.type.value}: {summary}", 1)
    print_summary(summary, command_s=command_seconds())
    if summary.get("load"):
        from cli.load import print_load_summary

        print_load_summary(summary["load"])
    STOP.raise_held_interrupt()  # a signal after the commit: cli.main says it (130/143)
    _say_why_not_complete(summary)
    return int(summary["exit_code"])


def _say_why_not_complete(summary: dict[str, Any]) -> None:
    """End stderr with the summary's message, one line, when the run did not complete (the
    counts are on stdout; stderr ended with Prefect's last log line)."""
    code = int(summary["exit_code"])
    if code:
        interrupted = code in (exit_code_for(s) for s in SIGNALS)
        sys.stderr.write(f"embedline: {'' if interrupted else 'error: '}{summary['message']}\n")


#: Modules a flow run imports on its way (0.4 CPU s in the flow's critical path): Prefect's
#: engines, FastAPI's encoder (its parameter serializer), pandas (pyarrow's first array).
_IMPORTED_BY_THE_FLOW = ("prefect.flow_engine", "prefect.task_engine", "fastapi.encoders",
                         "pandas")


def _import_the_flow() -> tuple[Any, Any]:
    """The flow and its cancel check, imported with Prefect (0.8 s of CPU here)."""
    with STOP.interrupts_deferred():  # an interrupt inside Prefect's import was lost
        from flows.cancellation import raise_if_interrupted_by_cancel
        from flows.embed_csv import embed_csv
    return embed_csv, raise_if_interrupted_by_cancel


def _import_while_the_server_starts() -> None:
    """Import ``_IMPORTED_BY_THE_FLOW`` while the CLI would only wait: the temporary server
    is ready 2-3 s after the CLI has planned and imported Prefect."""
    import importlib

    for name in _IMPORTED_BY_THE_FLOW:
        with contextlib.suppress(ImportError):  # a later Prefect or pyarrow without it
            importlib.import_module(name)


def _no_heartbeats(api: PrefectApi) -> Any:
    """Flow-run heartbeats only where something can use them: on Prefect Cloud, or when the
    user set ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` (env, profile or prefect.toml).

    Heartbeats only feed the zombie-run automation (a self-hosted server has it only if the
    user made it: https://docs.prefect.io/v3/advanced/detect-zombie-flows). On by default,
    they cost every run up to a second at its end (Prefect 3.9 joins the heartbeat thread,
    which sleeps in 1 s steps, ``flow_engine._send_heartbeats``): 0.85 s measured."""
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    from cli.prefect_env import is_prefect_cloud

    chosen = "heartbeat_frequency" in get_current_settings().flows.model_fields_set
    if api.server is None and (is_prefect_cloud(api.url) or chosen):
        return contextlib.nullcontext()
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def _check_before_prefect(settings: RunSettings) -> tuple[str, int] | None:
    """Everything that can be checked in about a second, before Prefect starts: the input
    (exists, header, encoding; S3: readable with these credentials), the output (a
    directory, or a bucket these credentials reach) and the API key. Returns (one-line
    message, exit code) or None."""
    from adapters.csv_source import check_header
    from embedline.errors import EmbedlineError, InputError

    if "://" not in settings.input:
        if os.path.isdir(settings.input):
            return f"{settings.input} is a directory, not a CSV file", EXIT_USAGE
        if not os.path.isfile(settings.input):
            return f"{settings.input}: no such file", EXIT_USAGE
    try:
        fmt = check_header(settings.input, id_column=settings.id_column,
                           text_column=settings.text_column, codec=settings.codec,
                           text_template=settings.text_template,
                           keep_columns=settings.kept_columns,
                           delimiter=settings.delimiter)
        if fmt.note:
            print(f"embedline: reading {os.path.basename(settings.input)} as: {fmt.note}",
                  file=sys.stderr)
    except InputError as exc:
        return str(exc), exc.exit_code
    try:
        _check_output(settings.output)
        check_ledger(settings.ledger)
        if settings.sink:
            from adapters.sinks import validate_sink_uri

            validate_sink_uri(settings.sink)
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    return _check_api_key(settings)


def _check_output(uri: str) -> None:
    """Create a local output directory, or look for a manifest in an S3 one (one HEAD):
    a file in the way, a missing bucket or missing credentials answer now.

    :raises EmbedlineError: the output is unusable (its exit code says which class).
    """
    from adapters.object_store import S3Store, open_store

    store = open_store(uri)
    store.prepare()
    if isinstance(store, S3Store):  # its prepare sends nothing: one HEAD answers now
        store.head_sha256("manifests/.embedline-check")


def _check_api_key(settings: RunSettings) -> tuple[str, int] | None:
    """OpenAI's own API with no key refuses every request (401): say so before start-up.
    With a configured Prefect server the flow decides (it may find a Secret block)."""
    from adapters.embeddings import api_key_from_env
    from embedline.settings import NO_API_KEY_MESSAGE

    if settings.requires_api_key and api_key_from_env() is None and not os.environ.get(
            "PREFECT_API_URL"):
        return NO_API_KEY_MESSAGE, EXIT_FATAL
    return None


#: The hard-exit hook of a run ``_without_prefect`` recorded (``running``) and left to the
#: flow; dropped once the flow ran, which records the run's end itself.
_recorded_run_hook: Any = None
_handed_leases: list[contextlib.ExitStack] = []  # held to the end: no gap before the flow's


def _without_prefect(settings: RunSettings, *, emit_events: bool,
                     ahead: PlanAhead | None = None,
                     ) -> dict[str, Any] | tuple[str, int] | None:
    """What ``run`` finishes before Prefect starts, on ``flows.run.Run`` as the flow would:
    a run already committed (its summary; the ledger catches up if it lags the store), or a
    run with nothing to send and no sink (a re-export with new bytes, same rows: commit it,
    about a second; every row copied from earlier objects: publish and commit). Else None:
    the flow runs next, in this process, with the plan (and reuse stage) handed over.
    (message, exit code) for an input or store error. A committed run writes nothing to
    the store, as DESIGN §4 asks. ``emit_events``: send
    ``embedline.run.committed`` for a commit (False with the CLI's temporary server, which
    runs no automations and is stopped when the command ends). ``ahead``: the plan comes
    from that child process instead (``cli/plan_ahead.py``).
    """
    import logging
    import time

    from adapters.csv_source import hand_over_plan, plan_csv
    from adapters.object_store import open_store
    from embedline.errors import EmbedlineError
    from embedline.models import RunSummary
    from flows.run import Run

    started = time.monotonic()
    try:
        opened = Run.open(settings, store=open_store(settings.output),
                          plan_input=ahead.plan if ahead is not None else
                          lambda s: plan_csv(s.input, **s.plan_arguments),
                          log=logging.getLogger("embedline.run"), started=started)
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    except OSError:
        return None  # let the flow report it with its full context
    if isinstance(opened, RunSummary):
        return opened.message, opened.exit_code
    if opened.committed is not None:
        opened.discard_scratch()
        return opened.already_committed().to_dict()
    summary = None if settings.sink else _commit_without_dispatch(opened, emit_events)
    if summary is None:  # the flow takes the plan over, with its scratch files
        hand_over_plan(opened.plan, settings.input, **settings.plan_arguments)
    else:
        opened.discard_scratch()
    return summary


def _commit_without_dispatch(run: Run, emit_events: bool,
                             ) -> dict[str, Any] | tuple[str, int] | None:
    """Record ``run``, find its work and, if no chunk task is needed (all published, or all
    left copied: ``flows.copied_run``), conclude it (``embedline.run.committed`` emitted if
    ``emit_events``); None if the flow has work to do."""
    from embedline.errors import EmbedlineError
    from embedline.models import RunSummary
    from flows.copied_run import may_publish_here, publish_if_all_copied
    from flows.dispatch import DispatchResult, Dispatched
    from flows.run import CommittedRun
    from tasks.events import emit_run_committed

    global _recorded_run_hook
    try:
        run.open_ledger()
    except (OSError, sqlite3.Error):
        return None  # the flow reports it with its full context
    try:
        with run.recorded(flow_run_id=None):
            refused = run.check_store()
            if refused is not None:
                return refused.to_dict()
            work = run.work_left()
            if isinstance(work, RunSummary):
                return work.to_dict()
            needed = run.needs_dispatch(work)
            dispatched = None if needed and not may_publish_here(run, work) else \
                Dispatched(DispatchResult(), None)
            with contextlib.ExitStack() as lease:
                if dispatched:  # gc keeps what the lease lists, until the flow ends if handed
                    lease.enter_context(run.leased())
                if needed and dispatched:
                    dispatched = publish_if_all_copied(run, work)
                    if dispatched is None:
                        _handed_leases.append(lease.pop_all())
                if dispatched is not None:
                    ended = run.conclude(
                        work, dispatched.result, cost=dispatched.cost, on_committed=lambda s: (
                            STOP.report.note_committed(run.run_key, str(s.manifest_uri), "nothing to "
                                                "resume"), emit_events and emit_run_committed(s)))
            if dispatched is None:  # `running`: an interrupt or hard exit marks it `interrupted`
                _recorded_run_hook = run.hard_stop_hook()
                STOP.exit.on_hard_exit(_recorded_run_hook)
                return None
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    finally:
        run.close()
    return (ended.summary if isinstance(ended, CommittedRun) else ended).to_dict()
