"""The command line of ``embedline run`` and ``embedline retry-failed``: each option with
its help, default and argparse type. ``cli.run`` registers the two commands and their
handlers."""

from __future__ import annotations

import argparse

from cli.arguments import (
    DEFAULT_LEDGER,
    INDEX_HELP,
    LEDGER_HELP,
    MAX_DELETE_HELP,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

__all__ = ["add_retry_arguments", "add_run_arguments"]


def add_run_arguments(run: argparse.ArgumentParser, *, command_options: bool = True) -> None:
    """The options of ``embedline run``: the flow's parameters, then (``command_options``) the
    CLI's own (``--progress-interval``, ``--debug``); ``embedline deployment`` takes the
    first only."""
    run.add_argument("input", metavar="INPUT", help="CSV file with an id and a text column")
    run.add_argument(
        "--output",
        default="./embedline-output",
        help="local directory, file:// URI or s3://bucket/prefix",
    )
    run.add_argument("--id-column", default="id", help="header name of the unique id column")
    run.add_argument("--text-column", default="text", help="header name of the column to embed")
    run.add_argument(
        "--text-template",
        default=None,
        metavar="TEMPLATE",
        type=_template_arg,
        help="build the text to embed from several columns: {column} "
        "placeholders, {{ }} for literal braces, \\n and \\t understood, "
        "e.g. '{title}\\n\\n{text}' (instead of --text-column)",
    )
    run.add_argument(
        "--keep-columns",
        default=None,
        metavar="A,B",
        help="columns carried beside the vectors, as read, into chunk objects, "
        "read_embeddings and sinks (comma-separated header names)",
    )
    run.add_argument(
        "--keep-text",
        action="store_true",
        help="keep the embedded text itself as column 'text' beside the vectors",
    )
    run.add_argument(
        "--encoding",
        default="auto",
        help="auto (UTF-8 with or without BOM, UTF-16 by its BOM, else detected "
        "and printed; a single-byte code page such as cp1252 must be "
        "named: auto refuses to guess it) or a codec name such as cp932, "
        "cp1252, utf-16-le",
    )
    run.add_argument(
        "--delimiter",
        default="auto",
        help="field separator: auto (Excel's 'sep=X' first line if there is one, else "
        "found in the header line among , ; tab |) or one character; 'tab' for tab",
    )
    run.add_argument(
        "--quoting",
        choices=("minimal", "none"),
        default="minimal",
        help='minimal: a field may be quoted ("a, b", doubled "" inside, line breaks); '
        "none: fields are split on the delimiter only and quotes are kept as written, "
        "one record per line (a plain TSV or database dump with literal quotes)",
    )
    run.add_argument(
        "--normalize",
        choices=("none", "NFC", "NFKC"),
        default="none",
        help="Unicode form each text is put in before it is hashed and sent: none (as "
        "read), NFC (composed: the same text exported decomposed is the same text), "
        "NFKC (also folds compatibility forms such as full-width letters and ligatures)",
    )
    run.add_argument(
        "--embedder",
        choices=("local", "openai"),
        default="local",
        help="local: all-MiniLM-L6-v2 in-process; openai: any OpenAI-compatible "
        "API (key from EMBEDLINE_API_KEY or OPENAI_API_KEY)",
    )
    run.add_argument(
        "--model",
        default=None,
        help="the embedder's model (default: all-MiniLM-L6-v2 for local, "
        "text-embedding-3-small for openai)",
    )
    run.add_argument(
        "--base-url",
        default="https://api.openai.com/v1",
        help="OpenAI-compatible API root; POST {base-url}/embeddings",
    )
    run.add_argument(
        "--dimensions",
        type=positive_int,
        default=None,
        help="shortened vectors (openai text-embedding-3) (default: the model's own)",
    )
    run.add_argument("--chunk-size", type=positive_int, default=1000, help="rows per chunk")
    run.add_argument(
        "--batch-size",
        type=positive_int,
        default=1000,
        help="rows per request (at most 2048, OpenAI's limit)",
    )
    run.add_argument(
        "--max-request-tokens",
        type=positive_int,
        default=200_000,
        help="estimated tokens per request (OpenAI allows 300,000)",
    )
    run.add_argument(
        "--concurrency",
        type=positive_int,
        default=8,
        help="embedding requests in flight across the process",
    )
    run.add_argument(
        "--rpm",
        type=positive_int,
        default=None,
        help="requests per minute (default: no limit: the server's 429s and "
        "Retry-After pace the run)",
    )
    run.add_argument(
        "--tpm", type=positive_int, default=None, help="tokens per minute (default: no limit)"
    )
    run.add_argument("--timeout", type=positive_float, default=60.0, help="seconds per request")
    run.add_argument(
        "--max-attempts",
        type=positive_int,
        default=6,
        help="attempts per request, the first included",
    )
    run.add_argument(
        "--max-input-tokens",
        type=positive_int,
        default=None,
        help="the model's limit per text, e.g. 8191 for text-embedding-3 "
        "(openai); longer texts follow --on-too-long (default: unset: the "
        "server's 400 isolates them)",
    )
    run.add_argument(
        "--on-too-long",
        choices=("dead-letter", "truncate"),
        default="dead-letter",
        help="what to do with a text over --max-input-tokens",
    )
    run.add_argument(
        "--auth-header",
        default=None,
        metavar="NAME",
        help="header that carries the API key: Authorization (sent as "
        "'Bearer KEY') or e.g. api-key for Azure-style gateways (sent as "
        "the bare key) (default: $EMBEDLINE_AUTH_HEADER, else Authorization)",
    )
    run.add_argument(
        "--encoding-format",
        choices=("auto", "base64", "float"),
        default="auto",
        help="how vectors travel: auto asks for base64 and falls back "
        "to float for the whole run if the server refuses base64",
    )
    run.add_argument(
        "--chunk-retries",
        type=non_negative_int,
        default=1,
        help="Prefect retries of a chunk after a retryable failure",
    )
    run.add_argument(
        "--chunk-retry-delay",
        type=non_negative_float,
        default=10.0,
        help="seconds between Prefect retries of a chunk",
    )
    run.add_argument(
        "--grace",
        type=non_negative_float,
        default=30.0,
        help="seconds in-flight chunks may finish after SIGINT/SIGTERM",
    )
    run.add_argument(
        "--wait-for-live-run",
        type=non_negative_float,
        default=3600.0,
        metavar="SECONDS",
        help="when an earlier run on this output (same model and dimensions) is still "
        "running, wait up to SECONDS for it to end, then copy what it published instead "
        "of sending it again; past that, step aside: exit 75, nothing published, run "
        "again later. 0 steps aside at once",
    )
    run.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    run.add_argument(
        "--retry-dead-letters",
        action="store_true",
        help="send again the rows of published chunks that are dead letters of "
        "kind rejected, too_long or server_error (never empty texts); the "
        "chunk is superseded by a new object, none is overwritten",
    )
    run.add_argument(
        "--allow-failed-rows",
        action="store_true",
        help="commit the manifest even if some rows are dead letters",
    )
    run.add_argument(
        "--on-empty-text",
        choices=("skip", "fail"),
        default="skip",
        help="empty or whitespace-only texts are never sent: skip lists them as "
        "empty_text dead letters and commits; fail keeps the manifest "
        "uncommitted unless --allow-failed-rows (exit 1)",
    )
    run.add_argument(
        "--allow-unconditional-store",
        action="store_true",
        help="run even if the store ignores conditional writes (unsafe)",
    )
    run.add_argument(
        "--price-per-million-tokens",
        type=non_negative_float,
        default=None,
        help="USD per 1M tokens, for the cost estimate in the summary (default: no estimate)",
    )
    run.add_argument(
        "--max-cost",
        type=positive_float,
        default=None,
        metavar="USD",
        help="stop before a request would take what this command has spent (tokens the "
        "server reported × --price-per-million-tokens, which it needs) above USD: exit 3, "
        "published chunks kept, a rerun with a higher cap resumes (default: no cap)",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="plan, look up what is published and reused, and print the rows, the new "
        "texts, their estimated tokens and cost; send no request, write nothing",
    )
    run.add_argument(
        "--no-reuse",
        dest="reuse",
        action="store_false",
        default=argparse.SUPPRESS,  # not "(default: True)": reuse is on
        help="send every text, even one whose vector the output already holds "
        "for this model (e.g. the model's weights changed under its name); "
        "without it, such texts are reused, not sent (default: off: reuse is on)",
    )
    run.add_argument(
        "--compact",
        action="store_true",
        default=False,
        help="write whole chunk objects this night instead of a delta of the last "
        "committed run (a compaction: readers then read no dropped rows; a night "
        "compacts by itself once its objects would hold 25%% rows it drops)",
    )
    run.add_argument(
        "--task-runner",
        choices=("threads", "dask"),
        default="threads",
        help="where chunk tasks run: threads here, or Dask workers (a local cluster, "
        "which with no PREFECT_API_URL uses this run's temporary Prefect server; or "
        "the cluster at --dask-address)",
    )
    run.add_argument(
        "--dask-address",
        default=None,
        help="an existing Dask scheduler (tcp://host:8786), checked before the run "
        "starts; its workers need an s3:// --output, a PREFECT_API_URL they can reach "
        "and the API key and AWS settings in their own environment "
        "(default: a local cluster)",
    )
    run.add_argument(
        "--dask-workers",
        type=positive_int,
        default=2,
        help="worker processes of the local Dask cluster",
    )
    run.add_argument(
        "--sink",
        default=None,
        metavar="URI",
        help="after the manifest commit, load the run into lancedb://PATH, "
        "PATH/NAME.lance, postgresql://user@host/db, "
        "qdrant://HOST:PORT/COLLECTION or qdrant+local://PATH (see embedline "
        "load) (default: no load)",
    )
    run.add_argument(
        "--max-delete-fraction", type=fraction, default=0.5, metavar="SHARE", help=MAX_DELETE_HELP
    )
    run.add_argument("--index", choices=("now", "later"), default="now", help=INDEX_HELP)
    run.add_argument(
        "--batch-api",
        action="store_true",
        help="--embedder openai: send the requests as Batch API batches (half "
        "the price, results within 24 h); the run waits for them, and a "
        "rerun after a crash or Ctrl-C collects them without paying twice",
    )
    # Read only with --batch-api, and refused without it (not ignored): absent from the
    # namespace unless given (SUPPRESS), so their help states the default itself
    run.add_argument(
        "--batch-poll-interval",
        type=positive_float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="with --batch-api: longest wait between two polls of the run's "
        "batches (the first polls come sooner) (default: 60.0)",
    )
    run.add_argument(
        "--batch-max-inputs",
        type=positive_int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="with --batch-api: inputs per batch (OpenAI allows 50,000) (default: 50000)",
    )
    run.add_argument(
        "--batch-fallback",
        choices=("batch", "sync"),
        default=argparse.SUPPRESS,
        help="with --batch-api: what batches leave unanswered (expired, "
        "cancelled, server errors): sent again as a batch, or "
        "synchronously at full price (default: batch)",
    )
    run.add_argument(
        "--batch-enqueued-tokens",
        type=positive_int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="with --batch-api: the account's enqueued-token limit for the "
        "model: batches are sized to fit it (default: 50,000 inputs per "
        "batch; a refusal token_limit_exceeded waits for earlier batches)",
    )
    if not command_options:
        return
    run.add_argument(
        "--progress-interval",
        type=non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="when stderr is not a terminal, a progress line every SECONDS (0: none)",
    )
    run.add_argument(
        "--debug",
        action="store_true",
        help="show tracebacks of expected failures (also in Dask workers)",
    )


def add_retry_arguments(retry: argparse.ArgumentParser) -> None:
    """The arguments of ``embedline retry-failed``: the run, and what to send again."""
    retry.add_argument("run", metavar="RUN", help="a run key or prefix (≥ 8 hex)")
    retry.add_argument(
        "--dead-letters",
        action="store_true",
        help="also send again the run's dead letters of kind rejected, "
        "too_long or server_error (only them; empty texts stay final)",
    )
    retry.add_argument("--ledger", default=DEFAULT_LEDGER, help=LEDGER_HELP)
    retry.add_argument("--debug", action="store_true", help="show tracebacks of expected failures")


def _template_arg(text: str) -> str:
    """argparse type of ``--text-template``: ``\\n``, ``\\t`` (and ``\\\\``) become the
    characters a shell's single quotes cannot hold (``embedline.template.unescape_cli``)."""
    from embedline.template import unescape_cli

    return unescape_cli(text)
