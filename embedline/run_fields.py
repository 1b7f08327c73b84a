"""The run's parameters, one field each: its type, default, bounds and the help text that
``embedline run --help`` prints and the Prefect form of the ``embed-csv`` flow shows.

``RunFields`` is the one declaration of the run's options. ``embedline.settings.RunSettings``
adds the rules between fields (validators) and the values derived from them;
``embedline.parameters`` builds the flow's parameter sections from these fields; and
``cli/run_options_table.py``, the plain table ``embedline run``'s argparse options are built
from (so that ``--help`` imports no pydantic), is generated from them by
``cli/gen_run_options.py``, whose ``--check`` a unit test runs.

What argparse needs that the field's type, default and bounds do not say is a ``Cli`` in the
field's ``Annotated`` metadata (pydantic keeps it and leaves it out of every schema).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Cli", "RunFields"]


@dataclass(frozen=True, slots=True)
class Cli:
    """What ``embedline run``'s option of a field needs beyond the field's type, default and
    bounds (``cli/gen_run_options.py`` reads them from those: the flag is the parameter name
    with dashes, ``--no-NAME`` for a field that defaults to True; a ``Literal`` gives the
    choices; ``ge``/``gt`` pick the argparse type of ``cli/arguments.py``)."""

    #: the value's name in ``--help`` (``--max-cost USD``); None: the flag's in capitals
    metavar: str | None = None
    #: an argparse type of ``cli/arguments.py`` by name, where the bounds cannot pick it
    type: str | None = None
    #: the flag's help, where it says something else than the field's description
    help: str | None = None


class RunFields(BaseModel):
    """Everything a run needs but secrets. Units: seconds, rows, requests/min, tokens/min.

    Limits that come from a documented API limit say so: ``batch_size`` ≤ 2048 inputs and
    ``max_request_tokens`` ≤ 300,000 tokens per request (OpenAI embeddings API reference).
    ``batch_size`` defaults to 1000 (LangChain's ``OpenAIEmbeddings`` default too): with the
    default ``chunk_size`` a chunk is one request, so a hosted API's per-request latency and
    RPM budget are paid once per chunk (128 sent 7.7× the requests of the English file).
    ``max_input_tokens`` (None: no check before sending) is the model's per-input limit,
    e.g. 8191 for OpenAI's text-embedding-3 models; unset, an over-long input is isolated
    by the server's 400 and the batch bisection instead.

    ``auth_header`` names the header that carries the API key (None: ``$EMBEDLINE_AUTH_HEADER``,
    else ``Authorization: Bearer``); ``encoding_format`` is how vectors travel (``auto``:
    base64, falling back to float once if the server refuses base64).

    ``chunk_retries`` are Prefect task retries of a chunk that failed with a retryable error
    after its requests' own retries, ``chunk_retry_delay_s`` apart; ``grace_s`` is how long
    in-flight chunks may finish after SIGINT/SIGTERM before they are released;
    ``on_empty_text`` ``skip`` (default) lets ``empty_text`` dead letters commit (an empty
    text is a property of the input), ``fail`` makes them block like any dead letter;
    ``allow_unconditional_store`` runs even on a store that ignores ``If-None-Match``
    (exactly-once is then not guaranteed).

    Documents (docs/reference/keys.md, docs/reference/output-layout.md): ``text_template`` builds
    each row's text from several columns (``{column}`` placeholders; None: the field of
    ``text_column``; a template that is one placeholder ``{X}`` is stored as ``text_column`` X);
    ``keep_columns`` are carried beside the vectors (names only here, never values; the CLI's
    ``A,B`` is split at commas); ``keep_text`` keeps the composed text as column ``text``;
    ``normalize`` puts each text in a Unicode form (``NFC``, ``NFKC``) before it is hashed
    and sent (``none``: as read). ``quoting`` ``none`` splits fields on the delimiter only
    (quotes are literal characters, a record is one line); ``minimal`` reads RFC 4180 quotes.

    The Batch API options (``batch_poll_interval_s`` … ``batch_enqueued_tokens``) are read
    only with ``batch_api``, the Dask options (``dask_address`` … ``dask_workers``) only with
    ``task_runner`` ``dask``: their help states their default, since the CLI and the flow leave
    them unset unless given (``embedline.settings.MODE_OPTIONS``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(
        description="CSV file with an id and a text column",
    )
    output: str = Field(
        default="./embedline-output",
        description="local directory, file:// URI or s3://bucket/prefix",
    )
    id_column: str = Field(
        default="id",
        description="header name of the unique id column",
    )
    text_column: str = Field(
        default="text",
        description="header name of the column to embed",
    )
    text_template: Annotated[str | None, Cli(metavar="TEMPLATE", type="template_text")] = Field(
        default=None,
        description=(
            "build the text to embed from several columns: {column} placeholders, {{ }} for "
            "literal braces, \\n and \\t understood, e.g. '{title}\\n\\n{text}' (default: "
            "none, the --text-column field is embedded as read)"
        ),
    )
    keep_columns: Annotated[tuple[str, ...] | None, Cli(metavar="A,B")] = Field(
        default=None,
        description=(
            "columns carried beside the vectors, as read, into chunk objects, read_embeddings "
            "and sinks (comma-separated header names) (default: none)"
        ),
    )
    keep_text: bool = Field(
        default=False,
        description="keep the embedded text itself as column 'text' beside the vectors",
    )
    encoding: str = Field(
        default="auto",
        description=(
            "auto (UTF-8 with or without BOM, UTF-16 by its BOM, else detected and printed; a "
            "single-byte code page such as cp1252 must be named: auto refuses to guess it) or a "
            "codec name such as cp932, cp1252, utf-16-le"
        ),
    )
    delimiter: str = Field(
        default="auto",
        description=(
            "field separator: auto (Excel's 'sep=X' first line if there is one, else found in "
            "the header line among , ; tab |) or one character; 'tab' for tab"
        ),
    )
    quoting: Literal["minimal", "none"] = Field(
        default="minimal",
        description=(
            'minimal: a field may be quoted ("a, b", doubled "" inside, line breaks); none: '
            "fields are split on the delimiter only and quotes are kept as written, one record "
            "per line (a plain TSV or database dump with literal quotes)"
        ),
    )
    normalize: Literal["none", "NFC", "NFKC"] = Field(
        default="none",
        description=(
            "Unicode form each text is put in before it is hashed and sent: none (as read), NFC "
            "(composed: the same text exported decomposed is the same text), NFKC (also folds "
            "compatibility forms such as full-width letters and ligatures)"
        ),
    )
    embedder: Literal["local", "openai"] = Field(
        default="local",
        description=(
            "local: all-MiniLM-L6-v2 in-process; openai: any OpenAI-compatible API (key from "
            "EMBEDLINE_API_KEY or OPENAI_API_KEY)"
        ),
    )
    model: str | None = Field(
        default=None,
        description=(
            "the embedder's model (default: all-MiniLM-L6-v2 for local, text-embedding-3-small "
            "for openai)"
        ),
    )
    base_url: str = Field(
        default="https://api.openai.com/v1",
        description="OpenAI-compatible API root; POST {base-url}/embeddings",
    )
    dimensions: int | None = Field(
        default=None,
        ge=1,
        description="shortened vectors (openai text-embedding-3) (default: the model's own)",
    )
    chunk_size: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="rows per chunk",
    )
    batch_size: int = Field(
        default=1000,
        ge=1,
        le=2048,
        description="rows per request (at most 2048, OpenAI's limit)",
    )
    max_request_tokens: int = Field(
        default=200_000,
        ge=1,
        le=300_000,
        description="estimated tokens per request (OpenAI allows 300,000)",
    )
    concurrency: int = Field(
        default=8,
        ge=1,
        le=256,
        description=(
            "embedding requests in flight at once per process: this one's with threads, each "
            "Dask worker's (whose threads set the chunks in flight)"
        ),
    )
    rpm: int | None = Field(
        default=None,
        ge=1,
        description=(
            "requests per minute (default: no limit: the server's 429s and Retry-After pace the "
            "run)"
        ),
    )
    tpm: int | None = Field(
        default=None,
        ge=1,
        description="tokens per minute (default: no limit)",
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds per request",
    )
    max_attempts: int = Field(
        default=6,
        ge=1,
        le=100,
        description="attempts per request, the first included",
    )
    max_input_tokens: int | None = Field(
        default=None,
        ge=1,
        description=(
            "the model's limit per text, e.g. 8191 for text-embedding-3 (openai); longer texts "
            "follow --on-too-long (default: unset: the server's 400 isolates them)"
        ),
    )
    on_too_long: Literal["dead-letter", "truncate"] = Field(
        default="dead-letter",
        description=(
            "what to do with a text over --max-input-tokens: a dead letter, or cut to "
            "3 x N UTF-8 bytes when read (the cut text is hashed, sent and reused)"
        ),
    )
    auth_header: Annotated[str | None, Cli(metavar="NAME")] = Field(
        default=None,
        description=(
            "header that carries the API key: Authorization (sent as 'Bearer KEY') or e.g. "
            "api-key for Azure-style gateways (sent as the bare key) (default: "
            "$EMBEDLINE_AUTH_HEADER, else Authorization)"
        ),
    )
    encoding_format: Literal["auto", "base64", "float"] = Field(
        default="auto",
        description=(
            "how vectors travel: auto asks for base64 and falls back to float for the whole run "
            "if the server refuses base64"
        ),
    )
    chunk_retries: int = Field(
        default=1,
        ge=0,
        le=10,
        description="Prefect retries of a chunk after a retryable failure",
    )
    chunk_retry_delay_s: float = Field(
        default=10.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds between Prefect retries of a chunk",
    )
    grace_s: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "seconds in-flight chunks may finish after SIGINT/SIGTERM (on Dask, also after "
            "the scheduler is lost)"
        ),
    )
    # at most this long a run waits for an earlier live run on its output that may send
    # texts it would copy, then steps aside, exit 75 (tasks/lease/overlap.py)
    wait_for_live_run_s: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=3600.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "when an earlier run on this output (same model and dimensions) is still running, "
            "wait up to SECONDS for it to end, then copy what it published instead of sending it "
            "again; past that, step aside: exit 75, nothing published, run again later. 0 steps "
            "aside at once"
        ),
    )
    ledger: str = Field(
        default=".embedline/ledger.sqlite3",
        description=(
            "the SQLite ledger; a relative path is relative to the current directory, so run "
            "`status`, `dead-letters` and `retry-failed` where `run` ran, or pass the same "
            "--ledger"
        ),
    )
    retry_dead_letters: bool = Field(
        default=False,
        description=(
            "send again the rows of published chunks that are dead letters of kind rejected, "
            "too_long or server_error (never empty texts); the chunk is superseded by a new "
            "object, none is overwritten"
        ),
    )
    allow_failed_rows: bool = Field(
        default=False,
        description="commit the manifest even if some rows are dead letters",
    )
    on_empty_text: Literal["skip", "fail"] = Field(
        default="skip",
        description=(
            "empty or whitespace-only texts are never sent: skip lists them as empty_text dead "
            "letters and commits; fail keeps the manifest uncommitted unless --allow-failed-rows "
            "(exit 1)"
        ),
    )
    allow_unconditional_store: bool = Field(
        default=False,
        description="run even if the store ignores conditional writes (unsafe)",
    )
    price_per_million_tokens: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description=(
            "USD per 1M tokens, for the cost estimate in the summary (default: no estimate)"
        ),
    )
    # stop before a request would take what the run spent (USD, reported tokens × price)
    # above it (adapters/embeddings/spend.py); a dry run sends nothing (flows/estimate.py)
    max_cost: Annotated[float | None, Cli(metavar="USD")] = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "stop before a request would take what this command has spent (tokens the server "
            "reported × --price-per-million-tokens, which it needs) above USD: exit 3, published "
            "chunks kept, a rerun with a higher cap resumes (default: no cap)"
        ),
    )
    dry_run: bool = Field(
        default=False,
        description=(
            "plan, look up what is published and reused, and print the rows, the new texts, "
            "their estimated tokens and cost; send no request, write nothing"
        ),
    )
    # the flag is --no-reuse: its help says what turning reuse off does
    reuse: Annotated[
        bool,
        Cli(
            help="send every text, even one whose vector the output already holds for this "
            "model (e.g. the model's weights changed under its name); without it, such texts "
            "are reused, not sent (default: off: reuse is on)"
        ),
    ] = Field(
        default=True,
        description="copy the vector of a text already published under the output with the "
        "same model and dimensions instead of sending it (off: --no-reuse, e.g. for a model "
        "whose weights changed under its name)",
    )
    # a full night, not a delta (tasks/plan/delta.py)
    compact: bool = Field(
        default=False,
        description=(
            "write whole chunk objects this night instead of a delta of the last committed run "
            "(a compaction: readers then read no dropped rows; a night compacts by itself once "
            "its objects would hold 25% rows it drops)"
        ),
    )
    task_runner: Literal["threads", "dask"] = Field(
        default="threads",
        description=(
            "where chunk tasks run: threads here, or Dask workers (a local cluster, which with "
            "no PREFECT_API_URL uses this run's temporary Prefect server; the cluster at "
            "--dask-address; or one --dask-cluster-class starts)"
        ),
    )
    dask_address: str | None = Field(
        default=None,
        description=(
            "an existing Dask scheduler (tcp://host:8786), checked before the run starts; its "
            "workers need an s3:// --output, a PREFECT_API_URL they can reach and the API key "
            "and AWS settings in their own environment (default: a local cluster)"
        ),
    )
    dask_workers: int = Field(
        default=2,
        ge=1,
        le=256,
        description="worker processes of the local Dask cluster",
    )
    # a cluster prefect-dask starts for the run (DaskTaskRunner's cluster_class and
    # cluster_kwargs), e.g. on Kubernetes or Coiled; secrets never go in its kwargs
    # (embedline.settings: refused), they stay in the environment the cluster's tools read
    dask_cluster_class: Annotated[str | None, Cli(metavar="CLASS")] = Field(
        default=None,
        description=(
            "a Dask cluster class the run starts and closes, by import path, e.g. "
            "dask_kubernetes.operator.KubeCluster or coiled.Cluster; importable where the flow "
            "runs; its workers need what --dask-address's do (default: a local cluster)"
        ),
    )
    dask_cluster_kwargs: Annotated[
        dict[str, Any] | None, Cli(metavar="JSON", type="json_object")
    ] = Field(
        default=None,
        description=(
            "keyword arguments of --dask-cluster-class, a JSON object, e.g. "
            '\'{"n_workers": 4, "image": "embedline:1"}\'; no secrets: a key naming a '
            "password, token, secret or API key with a value under it is refused (default: none)"
        ),
    )
    # a vector store to load the committed run into (docs/reference/sinks.md)
    sink: Annotated[str | None, Cli(metavar="URI")] = Field(
        default=None,
        description=(
            "after the manifest commit, load the run into lancedb://PATH, PATH/NAME.lance, "
            "postgresql://user@host/db, qdrant://HOST:PORT/COLLECTION or qdrant+local://PATH "
            "(see embedline load) (default: no load)"
        ),
    )
    # the most a commit's change set (share of the base run's rows) or a load (share of the
    # sink's rows) may delete before it stops, exit 2 (docs/reference/sinks.md)
    max_delete_fraction: Annotated[float, Cli(metavar="SHARE")] = Field(
        default=0.5,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description=(
            "stop, before deleting anything, a load that would delete more than this share of "
            "the rows the sink holds, or a commit whose change set removes more than this share "
            "of the previous run's rows (a cut-short export); exit 2 with the counts. 1 allows "
            "any delete"
        ),
    )
    # when the sink's index is built: after the load, or by `embedline index TARGET` later
    index: Literal["now", "later"] = Field(
        default="now",
        description=(
            "when the sink's index is built (pgvector's HNSW): now, after the load, in its own "
            "build-index task; or later: the load skips it and says so, and `embedline index "
            "TARGET` builds it (e.g. once maintenance_work_mem is raised)"
        ),
    )
    # Batch API mode (docs/design.md, "Batch API mode"): the openai embedder's requests go into
    # batches (half price, within 24 h); polled every ``batch_poll_interval_s`` seconds at
    # most; at most ``batch_max_inputs`` inputs per batch (OpenAI: 50,000); what batches
    # leave unanswered is sent again as a batch, or synchronously with ``sync``;
    # ``batch_enqueued_tokens`` (estimated tokens) sizes batches to the account's budget
    batch_api: bool = Field(
        default=False,
        description=(
            "--embedder openai: send the requests as Batch API batches (half the price, results "
            "within 24 h); the run waits for them, and a rerun after a crash or Ctrl-C collects "
            "them without paying twice"
        ),
    )
    batch_poll_interval_s: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "with --batch-api: longest wait between two polls of the run's batches (the first "
            "polls come sooner)"
        ),
    )
    batch_max_inputs: Annotated[int, Cli(metavar="N")] = Field(
        default=50_000,
        ge=1,
        le=50_000,
        description="with --batch-api: inputs per batch (OpenAI allows 50,000)",
    )
    batch_fallback: Literal["batch", "sync"] = Field(
        default="batch",
        description=(
            "with --batch-api: what batches leave unanswered (expired, cancelled, server "
            "errors): sent again as batches while the 24 h window lasts, or synchronously at "
            "full price"
        ),
    )
    batch_enqueued_tokens: Annotated[int | None, Cli(metavar="N")] = Field(
        default=None,
        ge=1,
        description=(
            "with --batch-api: the account's enqueued-token limit for the model: batches and "
            "parts are sized to fit it (default: 50,000 inputs per batch; a refusal "
            "token_limit_exceeded teaches the limit)"
        ),
    )
