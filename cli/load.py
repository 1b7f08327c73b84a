"""``embedline load RUN --to URI``: load a committed run into a vector-store sink.

Calls the ``load-run`` flow; each chunk with rows the sink lacks is a ``load-chunk-NNNN``
task. Rerunning resumes: what the sink itself holds is not loaded again (docs/reference/sinks.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cli.arguments import HELP_FORMATTER, fraction
from cli.failures import EXIT_USAGE, exit_on_api_loss, fail
from cli.prefect_console import quiet_prefect_signal_crashes
from cli.prefect_env import PrefectApiError, with_prefect_api
from cli.run_options import DEFAULT_LEDGER, INDEX_HELP, MAX_DELETE_HELP

__all__ = ["add_parsers", "already_loaded", "duration_s", "print_load_summary"]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``load``."""
    load = sub.add_parser(
        "load",
        help="load a committed run into LanceDB, pgvector or Qdrant",
        formatter_class=HELP_FORMATTER,
    )
    load.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help="a run key or prefix (≥ 8 hex); default: the latest committed run",
    )
    load.add_argument(
        "--to",
        required=True,
        metavar="URI",
        help="lancedb://PATH[?table=NAME], PATH/NAME.lance, "
        "postgresql://user@host:port/db[?table=NAME] (password from "
        "PGPASSWORD, never the URI), qdrant://HOST:PORT/COLLECTION (API "
        "key from QDRANT_API_KEY) or qdrant+local://PATH[?collection=NAME]",
    )
    load.add_argument(
        "--output",
        default=None,
        help="the run's output root (default: the ledger's record of RUN, "
        "or without RUN of its newest complete run, else "
        "./embedline-output)",
    )
    load.add_argument(
        "--ledger",
        default=DEFAULT_LEDGER,
        help="the ledger `run` wrote (relative to the current directory): "
        "where runs were published (what a sink holds, the sink says)",
    )
    load.add_argument(
        "--max-delete-fraction", type=fraction, default=0.5, metavar="SHARE", help=MAX_DELETE_HELP
    )
    load.add_argument("--index", choices=("now", "later"), default="now", help=INDEX_HELP)
    load.add_argument(
        "--allow-failed-rows",
        action="store_true",
        help="rows the sink refuses for good (an id PostgreSQL cannot store or "
        "index, a NaN vector: load dead letters) do not fail the load "
        "(exit 0); without it the load finishes, lists them, exit 1",
    )
    load.add_argument(
        "--lancedb-keep-versions",
        type=duration_s,
        default=None,
        metavar="DURATION",
        help="LanceDB: prune table versions older than this after the load "
        "(e.g. 0, 90s, 30m, 1h, 7d; default 1h); the latest is always kept",
    )
    load.add_argument(
        "--alias",
        metavar="NAME",
        default=None,
        help="model cutover: load into the table of the run's model behind "
        "NAME (NAME__MODEL_DIMS in the store --to names), check it, then "
        "switch NAME to it in one step (pgvector: a view; Qdrant: a "
        "collection alias); searches through NAME never see a half-loaded "
        "table",
    )
    load.add_argument(
        "--rollback",
        action="store_true",
        help="with --alias: point NAME back at the table it pointed at before "
        "the last switch (RUN is not read)",
    )
    load.set_defaults(handler=_load)


def duration_s(text: str) -> float:
    """``0``, ``90s``, ``30m``, ``1h``, ``7d`` (or plain seconds) as seconds.

    :raises argparse.ArgumentTypeError: anything else, or a negative value.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip().lower()
    scale = units.get(value[-1:])
    try:
        seconds = float(value[:-1] if scale else value) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (e.g. 0, 90s, 30m, 1h, 7d)"
        ) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration cannot be negative")
    return seconds


def _output_for(args: argparse.Namespace) -> str:
    """``--output``, else where the ledger says RUN (without RUN: its newest complete run)
    was published, else the default."""
    if args.output:
        return str(args.output)
    if os.path.exists(args.ledger):
        from adapters.ledger import Ledger

        ledger = Ledger(args.ledger)
        try:
            record = (
                ledger.find_run(args.run)
                if args.run
                else next((r for r in ledger.runs() if r.status == "complete"), None)
            )
        except ValueError:
            record = None
        finally:
            ledger.close()
        if record is not None:
            return record.output_uri
    return "./embedline-output"


def _load(args: argparse.Namespace) -> int:
    from adapters.sinks import validate_sink_uri
    from embedline.errors import InputError

    try:
        validate_sink_uri(args.to)
    except InputError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    if args.rollback:
        return _rollback(args)
    output = _output_for(args)
    manifest = _committed_manifest(output, args.run)
    if isinstance(manifest, tuple):
        return fail(f"embedline: error: {manifest[0]}", manifest[1])
    if args.alias:  # the check and the switch run in the flow, after the load
        refused = _alias_refused(args, manifest)
        if refused is not None:
            return fail(f"embedline: error: {refused}", EXIT_USAGE)
        return with_prefect_api(
            lambda api: _load_flow(args, api),
            on_lost=lambda loss: exit_on_api_loss(loss, kept="what was loaded is kept"),
        )
    done = already_loaded(
        output,
        args.run,
        args.to,
        args.ledger,
        manifest=manifest,
        allow_failed_rows=args.allow_failed_rows,
        index=args.index,
    )
    if done is not None:
        print_load_summary(done)
        return int(done["exit_code"])
    return with_prefect_api(
        lambda api: _load_flow(args, api),
        on_lost=lambda loss: exit_on_api_loss(loss, kept="what was loaded is kept"),
    )


def _alias_refused(args: argparse.Namespace, manifest: dict[str, Any] | None) -> str | None:
    """Why ``--alias`` cannot work with ``--to`` (a store without aliases, a bad name),
    said before Prefect starts; None if it can (or the manifest could not be read here)."""
    from adapters.sinks.factory import open_alias
    from embedline.errors import EmbedlineError, InputError
    from tasks.load.cutover import cutover_target

    if manifest is None:
        return None
    try:
        cutover_target(args.to, args.alias, manifest)
        switch = open_alias(args.to, args.alias)
    except InputError as exc:
        return str(exc)
    try:
        switch.check_name()  # a name taken by a table: said now, not after the whole load
    except InputError as exc:
        return str(exc)
    except EmbedlineError:
        return None  # the store cannot be reached from here: the flow says so
    finally:
        switch.close()
    return None


def _rollback(args: argparse.Namespace) -> int:
    """``--alias NAME --rollback``: NAME back to its previous table; one line, exit 0; or
    one line, exit 2 (no alias, or never switched)."""
    from adapters.sinks.factory import open_alias
    from embedline.errors import EmbedlineError
    from tasks.load.cutover import roll_back

    if not args.alias:
        return fail("embedline: error: --rollback needs --alias NAME", EXIT_USAGE)
    try:
        switch = open_alias(args.to, args.alias)
        try:
            done = roll_back(switch)
        finally:
            switch.close()
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    print(f"alias      {done.alias} -> {done.table} (rolled back from {done.previous})")
    return 0


def _committed_manifest(output: str, run: str | None) -> dict[str, Any] | tuple[str, int] | None:
    """The committed manifest to load (RUN's, else the latest), read before Prefect starts;
    (one line, exit code) when ``output`` holds none, said now rather than after Prefect's
    5 s start-up; None when the store could not be read here (the flow reports that with its
    full context)."""
    from adapters.object_store import open_store
    from embedline.errors import EmbedlineError
    from tasks.load.read_run import resolve_run

    try:
        return resolve_run(open_store(output), run)
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    except OSError:
        return None


def already_loaded(
    output: str,
    run: str | None,
    sink_uri: str,
    ledger_path: str,
    *,
    manifest: dict[str, Any] | None = None,
    allow_failed_rows: bool = False,
    index: str = "now",
) -> dict[str, Any] | None:
    """The summary of a load with nothing to do, found without starting Prefect: the sink
    itself holds exactly the run's rows (ids and text hashes: ``tasks.load.sink_state``
    ``left_to_load``, the plan the load stage applies); else
    None (also when the store or the sink cannot be read here: the flow reports that).
    ``manifest``: the run's committed manifest, if the caller read it already;
    ``ledger_path`` is not consulted (the ledger never decides what a sink holds).
    ``allow_failed_rows`` is accepted for the callers' sake: a sink that holds exactly the
    run has no load dead letters. With ``index`` ``now``, a sink whose index is missing
    (``VectorSink.needs_index``) is not done: the flow builds it.
    """
    import time

    from adapters.object_store import open_store
    from adapters.sinks import open_sink
    from embedline.errors import EmbedlineError
    from embedline.summary import LoadSummary
    from tasks.load.read_run import resolve_run
    from tasks.load.sink_state import ensure_run_table, left_to_load

    del ledger_path, allow_failed_rows
    started = time.monotonic()
    try:
        store = open_store(output)
        manifest = manifest or resolve_run(store, run)
        sink = open_sink(sink_uri)
    except (EmbedlineError, OSError):
        return None
    try:
        if sink.describe() is None:
            return None
        # a table of another shape or model: the flow refuses it (exit 3), even if it holds
        # the run's ids and hashes (a column added by hand)
        columns = ensure_run_table(sink, manifest)
        _, plan = left_to_load(store, manifest, sink, columns)
        if plan.done and index == "now" and sink.needs_index():
            return None
    except (EmbedlineError, OSError):
        return None
    finally:
        sink.close()
    if not plan.done:
        return None
    rows = sum(int(c["rows"]) for c in manifest["chunks"])
    return LoadSummary(
        0,
        "already_loaded",
        "the sink already holds exactly this run",
        sink=sink.identity,
        run_key=str(manifest["run_key"]),
        mode="-",
        rows_skipped=rows,
        chunks_total=len(manifest["chunks"]),
        chunks_skipped=len(manifest["chunks"]),
        wall_s=round(time.monotonic() - started, 3),
    ).to_dict()


def _load_flow(args: argparse.Namespace, api: Any) -> int:
    output = _output_for(args)
    try:
        api.wait_ready()
    except PrefectApiError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    from embedline.shutdown import STOP
    from flows.interrupt_handlers import interrupts_deferred

    with interrupts_deferred():  # an interrupt inside Prefect's import would be lost
        from flows.cancellation import raise_if_interrupted_by_cancel
        from flows.load import load_run

    STOP.command_handles_signals()  # SIGTERM as SIGINT in the flow
    quiet_prefect_signal_crashes()
    state = load_run(
        to=args.to,
        run=args.run,
        output=output,
        ledger=args.ledger,
        max_delete_fraction=args.max_delete_fraction,
        allow_failed_rows=args.allow_failed_rows,
        lancedb_keep_versions_s=args.lancedb_keep_versions,
        alias=args.alias,
        index=args.index,
        return_state=True,
    )  # an interrupt: cli.main says it
    summary = state.result(raise_on_failure=False)
    summary = getattr(summary, "summary", summary)
    raise_if_interrupted_by_cancel(summary)  # cancelled from Prefect: cli.main says it
    if not isinstance(summary, dict):
        return fail(f"embedline: the flow ended in state {state.type.value}: {summary}", 1)
    print_load_summary(summary)
    return int(summary["exit_code"])


def print_load_summary(summary: dict[str, Any], *, message: bool = True) -> None:
    """Print a load's summary (stdout), and with ``message`` its message on stderr when it
    did not finish (``run --sink`` ends with the run's own line, which holds it)."""
    print(f"sink       {summary['sink']}")
    if summary.get("run_key"):
        print(
            f"load       {summary['status']} (run {summary['run_key']}, mode "
            f"{summary.get('mode') or '-'})"
        )
        print(
            f"rows       {summary['rows_loaded']} upserted now, {summary['rows_skipped']} "
            f"loaded before, {summary['rows_deleted']} deleted"
        )
        if summary.get("rows_failed"):
            print(
                f"dead       {summary['rows_failed']} rows refused by the sink for good "
                f"(embedline dead-letters {str(summary['run_key'])[:12]} --sink URI)"
            )
        print(
            f"chunks     {summary['chunks_loaded']} loaded now, {summary['chunks_skipped']} "
            f"skipped, {summary['chunks_failed']} failed, of {summary['chunks_total']}"
        )
        if summary.get("alias_table"):
            before = summary.get("alias_previous")
            print(
                f"alias      {summary['alias']} -> {summary['alias_table']}"
                + (f" (was {before}; --rollback restores it)" if before else " (new)")
            )
        if summary.get("index_state"):
            state = str(summary["index_state"])
            took = (
                "" if state.startswith("deferred") else f" in {summary.get('index_s', 0.0):.1f} s"
            )
            print(f"index      {state}{took}")
        print(
            f"wall time  {summary['wall_s']:.1f} s (the load"
            + (
                f", of which {summary['index_s']:.1f} s the index)"
                if summary.get("index_s", 0.0) >= 0.05
                else ")"
            )
        )
    code = int(summary["exit_code"])
    if message and code != 0:
        from embedline.interrupts import is_interrupt_exit

        quiet = is_interrupt_exit(code)  # interrupted: no error of its own
        print(f"embedline: {'' if quiet else 'error: '}{summary['message']}", file=sys.stderr)
