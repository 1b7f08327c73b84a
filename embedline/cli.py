"""``embedline`` command line (DESIGN §3, a contract): ``run``, ``status``, ``dead-letters``.

``run`` calls the ``embed-csv`` Prefect flow in this process: the CLI and the flow are one
implementation. Prefect and the adapters are imported inside the commands, so ``--help`` and
usage errors answer at once and this core module stays free of them at import time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

EXIT_USAGE = 2

_PREFECT_DEFAULTS = {
    # A temporary Prefect server can take longer than Prefect's 20 s default to start on a
    # loaded 2-core machine (../shared/STACK-NOTES.md); no network here, so no telemetry.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # Adapters log to "embedline.*" (they never call Prefect): route those into run logs.
    "PREFECT_LOGGING_EXTRA_LOGGERS": "embedline",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedline",
        description="Embed a CSV's text column and publish the vectors exactly once.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="embed INPUT and publish chunks, then the manifest")
    run.add_argument("input", metavar="INPUT", help="CSV file with an id and a text column")
    run.add_argument("--output", default="./embedline-output",
                     help="local directory, file:// URI or s3://bucket/prefix")
    run.add_argument("--id-column", default="id")
    run.add_argument("--text-column", default="text")
    run.add_argument("--encoding", default="auto",
                     help="auto (UTF-8, BOM optional) or a codec name such as cp932")
    run.add_argument("--embedder", choices=("local", "openai"), default="local")
    run.add_argument("--model", default=None,
                     help="default: all-MiniLM-L6-v2 (local), text-embedding-3-small (openai)")
    run.add_argument("--base-url", default="https://api.openai.com/v1",
                     help="OpenAI-compatible API root; POST {base-url}/embeddings")
    run.add_argument("--dimensions", type=_positive_int, default=None)
    run.add_argument("--chunk-size", type=_positive_int, default=1000, help="rows per chunk")
    run.add_argument("--batch-size", type=_positive_int, default=128, help="rows per request")
    run.add_argument("--max-request-tokens", type=_positive_int, default=200_000,
                     help="estimated tokens per request (OpenAI allows 300,000)")
    run.add_argument("--concurrency", type=_positive_int, default=8,
                     help="embedding requests in flight across the process")
    run.add_argument("--rpm", type=_positive_int, default=None, help="requests per minute")
    run.add_argument("--tpm", type=_positive_int, default=None, help="tokens per minute")
    run.add_argument("--timeout", type=_positive_float, default=60.0,
                     help="seconds per request")
    run.add_argument("--max-attempts", type=_positive_int, default=6,
                     help="attempts per request, the first included")
    run.add_argument("--max-input-tokens", type=_positive_int, default=None,
                     help="the model's limit per text, e.g. 8191 for text-embedding-3 "
                          "(openai); longer texts follow --on-too-long. Unset: the server's "
                          "400 isolates them")
    run.add_argument("--on-too-long", choices=("dead-letter", "truncate"), default="dead-letter")
    run.add_argument("--chunk-retries", type=int, default=1,
                     help="Prefect retries of a chunk after a retryable failure")
    run.add_argument("--chunk-retry-delay", type=float, default=10.0, help="seconds")
    run.add_argument("--grace", type=float, default=30.0,
                     help="seconds in-flight chunks may finish after SIGINT/SIGTERM")
    run.add_argument("--ledger", default=".embedline/ledger.sqlite3")
    run.add_argument("--allow-failed-rows", action="store_true",
                     help="commit the manifest even if some rows are dead letters")
    run.add_argument("--allow-unconditional-store", action="store_true",
                     help="run even if the store ignores conditional writes (unsafe)")
    run.add_argument("--price-per-million-tokens", type=float, default=None,
                     help="USD per 1M tokens, for the cost estimate in the summary")
    run.add_argument("--task-runner", choices=("threads", "dask"), default="threads",
                     help="where chunk tasks run: threads here, or Dask workers")
    run.add_argument("--dask-address", default=None,
                     help="an existing Dask scheduler (tcp://host:8786); default: a local "
                          "cluster. Remote workers need an s3:// --output")
    run.add_argument("--dask-workers", type=_positive_int, default=2,
                     help="worker processes of the local Dask cluster")
    status = sub.add_parser("status", help="one line per run in the ledger")
    status.add_argument("run", nargs="?", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    status.add_argument("--ledger", default=".embedline/ledger.sqlite3")
    retry = sub.add_parser(
        "retry-failed",
        help="rerun a run's failed and never-run chunks with its recorded settings",
    )
    retry.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    retry.add_argument("--ledger", default=".embedline/ledger.sqlite3")
    dead = sub.add_parser("dead-letters", help="id<TAB>reason<TAB>http_status per dead letter")
    dead.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    dead.add_argument("--ledger", default=".embedline/ledger.sqlite3")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embedline`` console script; returns the exit code (DESIGN §3)."""
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "status":
        return _status(args)
    if args.command == "retry-failed":
        return _retry_failed(args)
    return _dead_letters(args)


def _settings_from(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from embedline.settings import RunSettings

    parameters = {k: v for k, v in vars(args).items() if k != "command"}
    try:
        return RunSettings.from_parameters(parameters)
    except ValidationError as exc:
        problems = "; ".join(
            (f"--{str(e['loc'][0]).replace('_', '-')}: " if e["loc"] else "") + e["msg"]
            for e in exc.errors()
        )
        raise SystemExit(_fail(f"embedline: error: {problems}", EXIT_USAGE)) from None


def _fail(message: str, code: int) -> int:
    print(message, file=sys.stderr)
    return code


def _run(args: argparse.Namespace) -> int:
    return _run_settings(_settings_from(args))


def _retry_failed(args: argparse.Namespace) -> int:
    """Rerun a recorded run: published chunks are skipped, the rest are embedded again."""
    from pydantic import ValidationError

    from embedline.settings import RunSettings

    ledger = _open_ledger(args.ledger)
    run = _find(ledger, args.run)
    recorded = ledger.run_settings(run.run_key)
    ledger.close()
    try:
        settings = RunSettings(**{**recorded, "ledger": args.ledger})
    except ValidationError as exc:
        return _fail(f"embedline: error: the recorded settings no longer validate: {exc}",
                     EXIT_USAGE)  # fmt: skip
    print(f"retrying run {run.run_key} ({run.input_name} -> {run.output_uri})", file=sys.stderr)
    return _run_settings(settings)


def _run_settings(settings: Any) -> int:
    if "://" not in settings.input:
        problem = _check_local_input(settings)
        if problem:
            return _fail(f"embedline: error: {problem}", EXIT_USAGE)
        committed = _already_committed(settings)
        if isinstance(committed, str):
            return _fail(f"embedline: error: {committed}", EXIT_USAGE)
        if committed is not None:
            from embedline.console import print_summary

            print_summary(committed)
            return 0
    for name, value in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    _isolate_temporary_server()
    from embedline.console import ProgressBar, print_summary
    from flows.embed_csv import embed_csv

    parameters = settings.to_parameters()
    with ProgressBar(enabled=sys.stderr.isatty()):
        try:
            state = embed_csv(**parameters, return_state=True)
        except KeyboardInterrupt:
            return _fail("embedline: interrupted; rerun the same command to resume", 130)
    summary = state.result(raise_on_failure=False)
    summary = getattr(summary, "summary", summary)  # a Failed state carries RunNotComplete
    if not isinstance(summary, dict):
        return _fail(f"embedline: the flow ended in state {state.type.value}: {summary}", 1)
    print_summary(summary)
    return int(summary["exit_code"])


def _check_local_input(settings: Any) -> str | None:
    """Check a local input's header before Prefect starts (seconds), so the most common
    mistakes (wrong path, wrong column name, wrong encoding) answer at once."""
    from adapters.csv_source import check_header
    from embedline.errors import InputError

    if os.path.isdir(settings.input):
        return f"{settings.input} is a directory, not a CSV file"
    if not os.path.isfile(settings.input):
        return f"{settings.input}: no such file"
    try:
        check_header(settings.input, id_column=settings.id_column,
                     text_column=settings.text_column, codec=settings.codec)  # fmt: skip
    except InputError as exc:
        return str(exc)
    return None


def _already_committed(settings: Any) -> dict[str, Any] | str | None:
    """The summary of a run whose manifest exists (a rerun of a finished command), found
    without starting Prefect; an input error's message; or None (run the flow).

    Costs one pass over the local input (0.6 s for 27 MB here) and one read of the store;
    it writes nothing, as DESIGN §4 asks of a completed run.
    """
    import time

    from adapters.csv_source import plan_csv
    from adapters.object_store import open_store
    from embedline import keys
    from embedline.errors import EmbedlineError, InputError
    from embedline.models import manifest_object_key
    from tasks.manifest import read_manifest, summary_from_manifest

    started = time.monotonic()
    try:
        store = open_store(settings.output)
        plan = plan_csv(settings.input, id_column=settings.id_column,
                        text_column=settings.text_column, codec=settings.codec,
                        chunk_size=settings.chunk_size, model=settings.effective_model,
                        dimensions=settings.dimensions)  # fmt: skip
        run_key = keys.run_key(plan.sha256, settings.id_column, settings.text_column,
                               settings.effective_model, settings.dimensions,
                               settings.chunk_size)  # fmt: skip
        manifest = read_manifest(store, run_key)
    except InputError as exc:
        return str(exc)
    except (EmbedlineError, OSError):
        return None  # let the flow report it with its full context
    if manifest is None:
        return None
    return summary_from_manifest(
        manifest, uri=store.uri_for(manifest_object_key(run_key)), output=store.uri,
        chunks_total=len(plan.chunks), wall_s=time.monotonic() - started,
    ).to_dict()  # fmt: skip


def _isolate_temporary_server() -> None:
    """Start Prefect's temporary server (used when no PREFECT_API_URL is set) in its own
    session, and stop it on a hard exit.

    A terminal's Ctrl-C signals the whole foreground process group. Prefect 3.9 starts its
    temporary server as a plain child (prefect/server/api/server.py,
    ``SubprocessASGIServer._run_uvicorn_command``), so the server died with the first Ctrl-C
    and the run, meant to stop gracefully, hung on a dead API. Only the ``subprocess``
    reference inside that Prefect module is replaced; everything else is untouched.
    """
    import subprocess

    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return  # a configured server: not ours to manage
    from prefect.server.api import server as prefect_server

    from embedline import shutdown

    started: list[subprocess.Popen[Any]] = []

    class _NewSessionSubprocess:
        def __getattr__(self, name: str) -> Any:
            return getattr(subprocess, name)

        @staticmethod
        def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:  # noqa: N802
            process = subprocess.Popen(*args, start_new_session=True, **kwargs)
            started.append(process)
            return process

    prefect_server.subprocess = _NewSessionSubprocess()  # type: ignore[assignment]
    shutdown.on_hard_exit(lambda: [p.terminate() for p in started if p.poll() is None])


def _open_ledger(path: str) -> Any:
    from adapters.ledger import Ledger

    if not os.path.exists(path):
        raise SystemExit(_fail(f"embedline: error: no ledger at {path}", EXIT_USAGE))
    return Ledger(path)


def _find(ledger: Any, key: str) -> Any:
    try:
        record = ledger.find_run(key)
    except ValueError as exc:
        raise SystemExit(_fail(f"embedline: error: {exc}", EXIT_USAGE)) from None
    if record is None:
        raise SystemExit(_fail(f"embedline: error: no run {key!r} in {ledger.path}", EXIT_USAGE))
    return record


def _status(args: argparse.Namespace) -> int:
    ledger = _open_ledger(args.ledger)
    runs = [_find(ledger, args.run)] if args.run else ledger.runs()
    for run in runs:
        states = ledger.state_counts(run.run_key)
        chunks = " ".join(f"{s}={states.get(s, 0)}" for s in
                          ("published", "failed", "running", "pending"))  # fmt: skip
        print(
            f"{run.run_key}\t{run.status}\trows={run.rows_published}/{run.input_rows} "
            f"dead_letters={run.rows_failed}\tchunks {chunks}\t{run.input_name}\t"
            f"{run.output_uri}\t{run.updated_at}"
        )
    return 0


def _tsv_field(value: str) -> str:
    """Escape backslash, tab, CR and LF so an id (quoted CSV fields may hold them) stays one
    TSV field (the convention of PostgreSQL's COPY text format)."""
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))  # fmt: skip


def _dead_letters(args: argparse.Namespace) -> int:
    ledger = _open_ledger(args.ledger)
    run = _find(ledger, args.run)
    for dead in ledger.run_dead_letters(run.run_key):
        status = "" if dead.http_status is None else str(dead.http_status)
        print(f"{_tsv_field(dead.id)}\t{dead.reason}\t{status}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
