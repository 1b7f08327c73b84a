"""``embedline run`` and ``embedline retry-failed``: check, plan, then call the ``embed-csv``
flow in this process. The checks (``cli.run_checks``) answer before Prefect starts; so does a
run with nothing to send (``cli.run_without_prefect``). The options are ``cli.run_options``',
the lines printed at the end ``cli.run_report``'s."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any

from cli.arguments import HELP_FORMATTER, usage_line
from cli.failures import EXIT_USAGE, fail
from cli.ledger_lookup import find_run, open_ledger
from cli.prefect_console import quiet_prefect_signal_crashes
from cli.prefect_env import PrefectApi, PrefectApiError, with_prefect_api
from cli.run_checks import check_before_prefect
from cli.run_options import add_retry_arguments, add_run_arguments
from cli.run_report import print_summaries, say_why_not_complete, stop_after_api_loss
from embedline.shutdown import STOP
from flows.interrupt_handlers import interrupts_deferred

if TYPE_CHECKING:  # imported when used: `embedline --help` stays fast
    from cli.plan_ahead import PlanAhead
    from embedline.settings import RunSettings
    from flows.session import Session

__all__ = ["add_parsers", "settings_from"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``run`` and ``retry-failed``."""
    run = sub.add_parser(
        "run",
        help="embed INPUT and publish chunks, then the manifest",
        formatter_class=HELP_FORMATTER,
    )
    add_run_arguments(run)
    run.set_defaults(handler=_run)
    retry = sub.add_parser(
        "retry-failed",
        help="rerun a run's failed and never-run chunks with its recorded settings",
        formatter_class=HELP_FORMATTER,
    )
    add_retry_arguments(retry)
    retry.set_defaults(handler=_retry_failed)


def settings_from(args: argparse.Namespace, *, not_parameters: tuple[str, ...] = ()) -> Any:
    """The ``RunSettings`` of ``run``'s options in ``args`` (``not_parameters``: more names of
    the command's own to leave out); what ``run`` refuses at parse time exits 2, one line."""
    from pydantic import ValidationError

    from embedline.settings import (
        RunSettings,
        options_without_their_mode,
        validation_message,
    )

    skipped = (*_CLI_ONLY, *not_parameters)
    parameters = {k: v for k, v in vars(args).items() if k not in skipped}
    ignored = options_without_their_mode(parameters)
    prog = f"embedline {args.command}"
    if ignored:  # refused, not ignored
        name, _, _, needs = ignored[0]
        flag = "--" + name.replace("_", "-")
        raise SystemExit(fail(usage_line(prog, f"argument {flag}: needs {needs}"), EXIT_USAGE))
    try:
        return RunSettings.from_parameters(parameters)
    except ValidationError as exc:
        message = validation_message(exc)  # "--flag: …", or a rule of several options
        said = f"argument {message}" if message.startswith("--") else message
        raise SystemExit(fail(usage_line(prog, said), EXIT_USAGE)) from None


_CLI_ONLY = ("command", "handler", "debug", "progress_interval")  # not flow parameters


def _run(args: argparse.Namespace) -> int:
    _set_debug(args.debug)
    return _run_settings(settings_from(args), progress_interval_s=args.progress_interval)


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
        settings = RunSettings(
            **{**recorded, "ledger": args.ledger, "retry_dead_letters": bool(args.dead_letters)}
        )
    except ValidationError as exc:
        return fail(
            "embedline: error: the recorded settings no longer validate: "
            f"{validation_message(exc)}",
            EXIT_USAGE,
        )
    print(f"retrying run {run.run_key} ({run.input_name} -> {run.output_uri})", file=sys.stderr)
    return _run_settings(settings)


def _run_settings(settings: RunSettings, *, progress_interval_s: float = 10.0) -> int:
    from cli.plan_ahead import PlanAhead, prefect_on_demand

    if settings.dry_run:
        return _dry_run(settings)

    lazy = prefect_on_demand(settings)  # else Prefect starts now, in parallel with planning
    ahead = None if lazy else PlanAhead.for_run(settings)  # first: the checks import it too
    try:
        problem = check_before_prefect(settings)
        if problem is not None:
            return fail(f"embedline: error: {problem[0]}", problem[1])
        return with_prefect_api(
            lambda api: _run_flow(settings, api, progress_interval_s, ahead),
            on_lost=lambda loss: stop_after_api_loss(loss, settings.grace_s),
            defer_server=lazy,
        )
    finally:
        if ahead is not None:
            ahead.close()


def _dry_run(settings: RunSettings) -> int:
    """``--dry-run``: print the estimate (``flows.estimate``) on stdout, exit 0; no
    Prefect, no request, nothing written to the output or recorded in the ledger."""
    from adapters.csv_source import plan_csv
    from adapters.object_store import open_store
    from embedline.errors import EmbedlineError
    from flows.estimate import estimate_run

    if "://" not in settings.input and not os.path.isfile(settings.input):
        return fail(f"embedline: error: {settings.input}: no such file", EXIT_USAGE)
    try:
        estimate = estimate_run(
            settings,
            store=open_store(settings.output),
            plan_input=lambda s: plan_csv(s.input, **s.plan_arguments),
        )
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    if isinstance(estimate, tuple):
        return fail(f"embedline: error: {estimate[0]}", estimate[1])
    print("\n".join(estimate.lines()))
    return 0


def _run_flow(
    settings: RunSettings, api: PrefectApi, progress_interval_s: float, ahead: PlanAhead | None
) -> int:
    """Finish the run before Prefect if it can (``cli.run_without_prefect``), else run the
    flow with what was prepared for it (``flows.session``)."""
    if ahead is not None:  # imported while the child plans (cli/plan_ahead.py)
        _import_the_flow()
    from cli.run_without_prefect import run_without_prefect
    from flows.session import Session, handing

    # a commit's event goes to a server someone reads, never to the temporary one this
    # command stops at its end (Prefect's events worker would wait for it: seconds, a line)
    before = (
        run_without_prefect(settings, emit_events=api.server is None, ahead=ahead)
        if "://" not in settings.input
        else Session(settings)
    )
    if isinstance(before, tuple):
        return fail(f"embedline: error: {before[0]}", before[1])
    if isinstance(before, dict):  # finished without Prefect
        print_summaries(before, before.get("load"))
        say_why_not_complete(before)
        return int(before["exit_code"])  # 1: every chunk published, dead letters
    with handing(before):  # the run's lease and stage held until the flow has run
        return _call_flow(settings, api, progress_interval_s, before)


def _call_flow(
    settings: RunSettings, api: PrefectApi, progress_interval_s: float, session: Session
) -> int:
    """Start Prefect and run the ``embed-csv`` flow in this process, with ``session`` (what
    was prepared for the run) current; print its summary; the exit code."""
    from cli.console import ProgressBar, command_seconds
    from embedline.parameters import grouped

    api.start_server()
    embed_csv, raise_if_interrupted_by_cancel = _import_the_flow()
    if api.server is not None:
        _import_while_the_server_starts()
    try:
        api.wait_ready()
    except PrefectApiError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    parameters = grouped(settings.to_parameters())
    STOP.raise_lost_interrupt()  # a Ctrl-C that a library swallowed while it imported
    STOP.command_handles_signals()  # SIGTERM as SIGINT; held once committed
    quiet_prefect_signal_crashes()
    with (
        ProgressBar(terminal=sys.stderr.isatty(), interval_s=progress_interval_s),
        _no_heartbeats(api),
    ):
        state = embed_csv(**parameters, return_state=True)  # an interrupt: cli.main says it
    session.flow_has_run()
    summary = state.result(raise_on_failure=False)
    summary = getattr(summary, "summary", summary)  # a Failed state carries RunNotComplete
    raise_if_interrupted_by_cancel(summary)  # cancelled before a summary: cli.main says it
    if not isinstance(summary, dict):
        return fail(f"embedline: the flow ended in state {state.type.value}: {summary}", 1)
    print_summaries(summary, summary.get("load"), command_s=command_seconds())
    STOP.raise_held_interrupt()  # a signal after the commit: cli.main says it (130/143)
    say_why_not_complete(summary)
    return int(summary["exit_code"])


#: Modules a flow run imports on its way (0.4 CPU s in the flow's critical path): Prefect's
#: engines, FastAPI's encoder (its parameter serializer), pandas (pyarrow's first array).
_IMPORTED_BY_THE_FLOW = ("prefect.flow_engine", "prefect.task_engine", "fastapi.encoders", "pandas")


def _import_the_flow() -> tuple[Any, Any]:
    """The flow and its cancel check, imported with Prefect (0.8 s of CPU here)."""
    with interrupts_deferred():  # an interrupt inside Prefect's import is lost
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
