"""What a run and a load report: ``RunSummary`` (the CLI's summary, the flow's final state,
the summary artifact), ``LoadSummary``, and the cost arithmetic they print (``usd``,
``run_cost``, ``tokens_avoided``, ``saved_phrase``; prices in USD per million tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from embedline.models import LoadDeadLetter, dead_letters_phrase, shown_id

__all__ = [
    "BATCH_PRICE_FACTOR",
    "LoadSummary",
    "RunSummary",
    "load_dead_letters_end",
    "run_cost",
    "saved_phrase",
    "tokens_avoided",
    "usd",
]


#: The Batch API's price as a share of the synchronous one (OpenAI: 50 % for embeddings).
BATCH_PRICE_FACTOR = 0.5


def usd(amount: float) -> str:
    """``$1,234.56``; below a cent, four significant digits (``$0.00006235``), never in
    exponent notation."""
    if amount >= 0.01 or amount <= 0:
        return f"${amount:,.2f}"
    return f"${amount:.{3 - math.floor(math.log10(amount))}f}".rstrip("0")


def run_cost(tokens: int, batch_tokens: int, price_per_million: float) -> tuple[float, float]:
    """(USD spent, USD the Batch API saved) for ``tokens``, of which ``batch_tokens`` were
    billed at the batch price (``BATCH_PRICE_FACTOR`` of ``price_per_million``, the
    synchronous USD per 1M tokens)."""
    batch = min(batch_tokens, tokens)
    spent = ((tokens - batch) + batch * BATCH_PRICE_FACTOR) * price_per_million / 1e6
    return spent, batch * (1 - BATCH_PRICE_FACTOR) * price_per_million / 1e6


def tokens_avoided(
    rows: int, *, estimated: int, reported: int, bound: int
) -> dict[str, int | bool]:
    """The ``tokens_saved`` of ``rows`` rows that reuse and deduplication kept from the API,
    and whether it is measured (``tokens_saved_measured``).

    ``estimated`` is ``estimate_tokens`` of those rows' texts (UTF-8 bytes / 3, above what
    English costs): an upper bound, returned as it is when nothing measures the rate. When
    this run's answers reported ``reported`` tokens for texts of ``bound`` such estimated
    tokens, ``estimated`` is scaled by ``reported / bound``: each row counts at its own
    length, so one long text sent does not price every short one reused.
    """
    if not rows:
        return {"tokens_saved": 0, "tokens_saved_measured": False}
    if reported > 0 and bound > 0:
        return {"tokens_saved": round(estimated * reported / bound), "tokens_saved_measured": True}
    return {"tokens_saved": estimated, "tokens_saved_measured": False}


def saved_phrase(*, rows: int, tokens_saved: int, measured: bool, price: float | None) -> str:
    """What reuse and deduplication avoided, for the summaries: the ``rows`` not sent and
    their tokens (``tokens_avoided``: ``measured``, their lengths at the tokens per byte this
    run's answers reported, else the byte estimate, an upper bound), priced at ``price``
    (USD per 1M tokens) when given."""
    if not rows:
        return "nothing (no row reused or deduplicated)"
    money = f"{usd(tokens_saved * price / 1e6)}: " if price is not None else ""
    if measured:
        return (
            f"{money}{tokens_saved:,} tokens for {rows:,} rows not sent (their lengths at the "
            "tokens per byte this run's answers reported)"
        )
    return (
        f"at most {money}{tokens_saved:,} tokens for {rows:,} rows not sent (UTF-8 bytes / 3: "
        "nothing charged this run to measure tokens per input)"
    )


@dataclass(slots=True)
class RunSummary:
    """What a run did, for the CLI, the flow's final state and artifacts. Counts only.

    ``exit_code`` follows docs/reference/cli.md: 0 done, 1 incomplete, 2 input error, 3 fatal,
    130/143 interrupted. Rows are data records; ``wall_s`` is seconds; ``tokens`` as
    reported by the API.
    """

    exit_code: int
    status: str
    message: str
    run_key: str | None = None
    output: str | None = None
    manifest_uri: str | None = None
    rows_total: int = 0
    rows_published: int = 0
    rows_skipped: int = 0
    rows_failed: int = 0
    # a delta night (docs/nights.md): the run it builds on and the rows kept from its objects
    delta_base: str | None = None
    rows_inherited: int = 0
    chunks_total: int = 0
    chunks_published: int = 0
    chunks_skipped: int = 0
    chunks_failed: int = 0
    chunks_released: int = 0
    chunks_not_run: int = 0
    # published meanwhile by another run sharing the work (not "before"; counted in skipped)
    rows_concurrent: int = 0
    chunks_concurrent: int = 0
    tokens: int = 0
    requests: int = 0
    wall_s: float = 0.0
    dimensions: int | None = None
    inputs: int = 0  # texts the API answered with vectors (charged); an in-process model's
    # texts embedded
    # requests that got no vectors (rate limited, a server error, a timeout), sent again or
    # given up, and the texts they carried: not charged (counted in-process: 0 on Dask)
    requests_retried: int = 0
    inputs_retried: int = 0
    rows_reused: int = 0  # vectors copied from objects of earlier runs
    rows_deduplicated: int = 0  # rows whose text this run embedded once for another row
    # tokens reuse and deduplication avoided (``tokens_avoided``): the rows' lengths at the
    # tokens per byte this run's answers reported, or (``tokens_saved_measured`` False:
    # nothing was charged to measure) the byte estimate, an upper bound
    tokens_saved: int = 0
    tokens_saved_measured: bool = False
    price_per_million_tokens: float | None = None  # USD, for the cost estimate
    # change set against the previous committed run (None: not committed / v1 manifest)
    rows_added: int | None = None
    rows_changed: int | None = None
    rows_removed: int | None = None
    rows_unchanged: int | None = None
    changes_object: str | None = None
    changes_base: str | None = None
    load: dict[str, object] | None = None  # the LoadSummary of ``--sink``, when given
    # a retry of a committed run's dead letters (docs/reference/output-layout.md, "Generations"):
    # its generation, the run it supersedes
    generation: int = 0
    supersedes: str | None = None
    rows_empty: int = 0  # empty texts skipped (--on-empty-text skip), counted in rows_failed
    # Batch API mode: of ``tokens``, those billed at the batch price (half), of ``inputs``
    # the texts batches answered, and the batches
    batch_tokens: int = 0
    batches: int = 0
    batch_inputs: int = 0

    def to_dict(self) -> dict[str, object]:
        """Return the summary as a JSON-ready dict."""
        return asdict(self)


@dataclass(slots=True)
class LoadSummary:
    """What loading a committed run into a sink did (docs/reference/sinks.md). Counts only, no text.

    ``exit_code``: 0 loaded, 1 chunks failed to load (rerun resumes) or rows the sink refuses
    for good (``rows_failed`` load dead letters, without ``allow_failed_rows``: a rerun says
    so again at once), 2 usage or input error, 3 a mismatch or refusal retrying cannot fix.
    ``mode`` is ``replace`` (rows of
    other runs deleted after every chunk loaded) or ``changes`` (only the change set's
    added and changed rows upserted, its removed ids deleted). Rows are vectors; ``wall_s``
    seconds; ``rows_skipped`` counts rows of chunks loaded into this sink before.
    """

    exit_code: int
    status: str
    message: str
    sink: str | None = None
    run_key: str | None = None
    mode: str | None = None
    rows_loaded: int = 0
    rows_skipped: int = 0
    rows_deleted: int = 0
    chunks_total: int = 0
    chunks_loaded: int = 0
    chunks_skipped: int = 0
    chunks_failed: int = 0
    wall_s: float = 0.0
    # load dead letters: rows the sink refuses for good (docs/reference/sinks.md)
    rows_failed: int = 0
    index_s: float = 0.0  # seconds the sink's index build (pgvector HNSW) or compaction took
    index_state: str = ""  # what it did: "HNSW index built", "HNSW index present", "compacted…"
    # model cutover (``--alias``): the alias, the table it now points at, and the one before
    alias: str | None = None
    alias_table: str | None = None
    alias_previous: str | None = None

    def to_dict(self) -> dict[str, object]:
        """Return the summary as a JSON-ready dict."""
        return asdict(self)


def load_dead_letters_end(
    summary: LoadSummary, dead: Sequence[LoadDeadLetter], allowed: bool
) -> LoadSummary:
    """A finished load with rows the sink refuses for good: exit 1 naming them (a rerun
    cannot load them, so it says the same at once), or 0 with ``allow_failed_rows``."""
    if not dead:
        return summary
    shown = ", ".join(f"{shown_id(d.id)} ({d.reason}: {d.message})" for d in dead[:3])
    more = f" and {len(dead) - 3} more" if len(dead) > 3 else ""
    listing = f"embedline dead-letters {(summary.run_key or '')[:12]} --sink '{summary.sink}'"
    what = (
        f"{dead_letters_phrase(len(dead))} of the load: the sink refuses them for good "
        f"({shown}{more}; see `{listing}`); the run's other rows are loaded"
    )
    if allowed:
        return replace(summary, rows_failed=len(dead), message=what)
    advice = (
        ": fix those ids (or the table) in the input, or accept them with "
        "--allow-failed-rows (parameter allow_failed_rows)"
    )
    return replace(
        summary, rows_failed=len(dead), exit_code=1, status="dead_letters", message=what + advice
    )
