"""Plain records passed between stages: plan → embed → publish → record.

Frozen, slotted dataclasses (picklable, so Prefect and Dask can ship them). None of them
holds a secret; only ``Row`` holds input text, and its ``repr`` leaves the text out.
"""

from __future__ import annotations

import builtins
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

__all__ = [
    "BATCH_PRICE_FACTOR",
    "EMPTY_TEXT",
    "RETRYABLE_DEAD_LETTERS",
    "BatchLayout",
    "ChunkBatches",
    "ChunkOutcome",
    "ChunkSpec",
    "DeadLetter",
    "InputPlan",
    "InputSource",
    "LoadDeadLetter",
    "LoadSummary",
    "ManifestChunk",
    "ReusePlan",
    "ReuseSource",
    "Row",
    "RunSummary",
    "blocking_dead_letters",
    "chunk_generation",
    "chunk_object_key",
    "committed_dead_letters_note",
    "dead_letters_block_message",
    "dead_letters_phrase",
    "empty_texts_phrase",
    "load_dead_letters_end",
    "manifest_object_key",
    "run_cost",
    "saved_phrase",
    "shown_id",
    "tokens_avoided",
    "usd",
]


def chunk_object_key(chunk_key: str, generation: int = 0) -> str:
    """Return the object key of a chunk under the output root (docs/reference/output-layout.md):
    generation 0 is ``chunks/{key}.parquet``, generation N ≥ 1 (its dead letters retried) is
    ``chunks/{key}.g{N}.parquet``."""
    if generation:
        return f"chunks/{chunk_key}.g{generation}.parquet"
    return f"chunks/{chunk_key}.parquet"


#: Dead-letter reasons a later generation may retry; ``empty_text`` stays final.
RETRYABLE_DEAD_LETTERS = frozenset({"rejected", "too_long", "server_error"})


def chunk_generation(object_key: str) -> int:
    """The generation of a chunk object key (0 for ``chunks/{key}.parquet``)."""
    match = re.search(r"\.g([0-9]+)\.parquet$", object_key)
    return int(match.group(1)) if match else 0


def dead_letters_phrase(rows: int) -> str:
    """``"1 row is a dead letter"`` / ``"3 rows are dead letters"`` (messages, summaries)."""
    return "1 row is a dead letter" if rows == 1 else f"{rows:,} rows are dead letters"


def dead_letters_block_message(rows: int, run_key: str) -> str:
    """The message of a run whose every chunk is published but ``rows`` dead letters keep
    its manifest from being committed (without ``--allow-failed-rows``; in a deployment the
    parameter ``allow_failed_rows``)."""
    return (
        f"{dead_letters_phrase(rows)} (see `embedline dead-letters {run_key}`); the "
        "manifest is committed only with --allow-failed-rows (parameter "
        "allow_failed_rows)"
    )


#: The dead-letter reason of an empty or whitespace-only text (never sent,
#: docs/reference/failure-classes.md).
EMPTY_TEXT = "empty_text"


def blocking_dead_letters(dead_letters: Iterable[DeadLetter], on_empty_text: str) -> int:
    """How many of ``dead_letters`` keep a run from committing without
    ``--allow-failed-rows``: all of them with ``on_empty_text="fail"``; with ``"skip"``
    (the default) all but the ``empty_text`` ones, which are a property of the input."""
    return sum(1 for d in dead_letters if on_empty_text == "fail" or d.reason != EMPTY_TEXT)


def empty_texts_phrase(rows: int) -> str:
    """``"1 empty text skipped"`` / ``"3 empty texts skipped"``, naming where they are listed."""
    what = "1 empty text" if rows == 1 else f"{rows:,} empty texts"
    return f"{what} skipped (dead letters empty_text)"


def committed_dead_letters_note(rows_failed: int, rows_empty: int) -> str:
    """What a committed run's summary says of its dead letters: the ``rows_empty`` empty
    texts skipped, and the other ones committed with ``--allow-failed-rows``; "" for none."""
    parts = []
    if rows_failed > rows_empty:
        parts.append(
            f"{dead_letters_phrase(rows_failed - rows_empty)} (committed with --allow-failed-rows)"
        )
    if rows_empty:
        parts.append(empty_texts_phrase(rows_empty))
    return "; ".join(parts)


def manifest_object_key(run_key: str) -> str:
    """Return the object key of a run's manifest under the output root
    (docs/reference/output-layout.md)."""
    return f"manifests/{run_key}.json"


@dataclass(frozen=True, slots=True)
class InputSource:
    """Where the CSV is (a local path or ``s3://`` URI) and how its records map to ids and texts.

    ``encoding`` is a Python codec name (``utf-8``, ``cp932``); ``data_start`` is the byte
    offset of the first data record (after the header); ``id_index``/``text_index`` are
    0-based field positions; ``n_fields`` is the header's width. ``quoting`` is how fields
    are split (``minimal`` or ``none``: ``adapters.csv_format.QUOTING``); ``normalize`` the
    Unicode form the composed text is put in (``NFC``, ``NFKC``; ``none``: as read).
    """

    path: str
    name: str
    encoding: str
    id_column: str
    text_column: str
    id_index: int
    text_index: int
    n_fields: int
    data_start: int
    version: str | None = None  # S3 ETag seen at planning (chunk reads require it)
    newline: str = "\n"  # "\n", or "\r" for CR-only line ends
    delimiter: str = ","  # the field separator chosen (--delimiter, or sniffed)
    note: str = ""  # what format sniffing detected, for the log (empty: all defaults)
    # documents (docs/reference/keys.md): the text template's parts as (literal, field position; -1
    # for a trailing literal), empty for the plain text column; kept columns and their positions
    text_parts: tuple[tuple[str, int], ...] = ()
    kept_columns: tuple[str, ...] = ()
    kept_indexes: tuple[int, ...] = ()
    keep_text: bool = False
    text_template: str | None = None  # as given (None: the plain text column)
    quoting: str = "minimal"
    normalize: Literal["none", "NFC", "NFKC"] = "none"  # docs/reference/keys.md, "Documents"

    def text_of(self, fields: Sequence[str]) -> str:
        """A record's text: the template composed from ``fields``, or its text field, in the
        Unicode form ``normalize``."""
        if not self.text_parts:
            text = fields[self.text_index]
        else:
            text = "".join(
                literal + (fields[i] if i >= 0 else "") for literal, i in self.text_parts
            )
        if self.normalize == "none":
            return text
        return unicodedata.normalize(self.normalize, text)

    def kept_of(self, fields: Sequence[str]) -> tuple[str, ...]:
        """A record's kept values, exactly as read (empty without kept columns)."""
        return tuple(fields[i] for i in self.kept_indexes)

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """The columns a chunk object has after embedline's own: the kept columns, then
        ``text`` with ``keep_text`` (docs/reference/output-layout.md)."""
        return self.kept_columns + (("text",) if self.keep_text else ())


@dataclass(frozen=True, slots=True)
class ChunkPart:
    """The rows a delta chunk takes from one planned chunk (docs/design.md, "Delta nights"):
    the planned chunk's records (fields as ``ChunkSpec``'s) and the 0-based ``positions``
    among them that it takes, ascending."""

    first_row: int
    line_start: int
    rows: int
    byte_start: int
    byte_stop: int
    bytes_sha256: str
    positions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """One chunk of the input: ``rows`` consecutive records starting at ``first_row``.

    ``first_row`` is the 1-based record number (header excluded) and ``line_start`` the
    1-based physical line at ``byte_start``. ``byte_start``/``byte_stop`` (bytes, stop
    exclusive) lie on record boundaries, so a task reads only its own rows;
    ``bytes_sha256`` is the SHA-256 of those bytes, to detect an input changed mid-run.
    """

    index: int
    key: str
    first_row: int
    line_start: int
    rows: int
    byte_start: int
    byte_stop: int
    bytes_sha256: str
    generation: int = 0  # > 0: supersedes the previous generation's dead letters
    # a delta chunk: the rows it takes from planned chunks (``rows`` of them in all; the byte
    # range spans the parts; ``bytes_sha256`` empty); none: the chunk is its byte range
    parts: tuple[ChunkPart, ...] = ()

    @property
    def object_key(self) -> str:
        """The chunk's object key, ``chunks/{key}.parquet`` (``….g{N}.parquet`` for N ≥ 1)."""
        return chunk_object_key(self.key, self.generation)


@dataclass(frozen=True, slots=True)
class DeltaBase:
    """What a delta night inherits from the committed run ``base_run_key``
    (docs/design.md, "Delta nights"): the base's manifest entries it keeps (``drop_ids``
    updated), the rows they give (``rows_inherited``), the input's empty texts (dead
    letters written to no chunk: ``rows_empty``) and the change counts of its change set,
    whose rows wait in the plan's scratch directory (``tasks/plan/delta.py``)."""

    base_run_key: str
    base_rows: int  # the base's rows_published
    dimensions: int  # the base's vector length, which the night's vectors must have
    inherited: tuple[dict[str, object], ...]
    rows_inherited: int
    rows_empty: int
    added: int
    changed: int
    removed: int
    unchanged: int


@dataclass(frozen=True, slots=True)
class InputPlan:
    """Result of the planning pass: the input's identity and its chunks.

    ``sha256`` and ``bytes`` cover the whole file; ``rows`` counts data records.
    """

    source: InputSource
    sha256: str
    bytes: int
    rows: int
    chunks: tuple[ChunkSpec, ...]
    # the planning pass's scratch directory (``adapters.row_facts``: its ``rows`` spill of
    # text hashes feeds the reuse stage); None when planned without one
    scratch: str | None = None
    # a delta night (``tasks/plan/delta.py``): ``chunks`` are its delta chunks
    delta: DeltaBase | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """One data record: 1-based ``row_number`` (records), 1-based physical ``line``."""

    row_number: int
    line: int
    id: str
    text: str = field(repr=False)
    text_sha256: str
    kept: tuple[str, ...] = field(default=(), repr=False)  # kept values (never logged)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A row that will not be embedded for this content; never carries the text.

    ``reason`` is a short word (``empty_text``, ``too_long``, ``rejected``,
    ``server_error``); ``http_status`` is the server's status when one answered.
    """

    row_number: int
    id: str
    reason: str
    http_status: int | None = None
    attempts: int = 0

    def to_dict(self) -> dict[str, object]:
        """Return the record as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class LoadDeadLetter:
    """A row of a committed run that a sink refuses for good (docs/reference/sinks.md); never the
    text.

    ``chunk_index`` is the manifest chunk that holds it. ``reason`` is a short word
    (``id_has_nul``, ``id_too_long``, ``value_too_long``, ``untranslatable``,
    ``non_finite_vector``, ``invalid_value``, ``check_violation``); ``sqlstate`` is
    PostgreSQL's error code when the server refused it (None for a check made before
    sending); ``message`` the store's own one-line reason (no row values).
    """

    chunk_index: int
    id: str
    reason: str
    sqlstate: str | None = None
    message: str = ""

    def to_dict(self) -> dict[str, object]:
        """Return the record as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What a chunk task did. ``rows`` counts rows in the published object.

    ``created`` is False when the object already existed with our bytes (an earlier or
    concurrent run published it). ``tokens`` are as reported by the API (0 when unknown),
    ``requests`` counts HTTP requests sent, retries included.
    """

    index: int
    key: str
    object_key: str
    object_sha256: str
    rows: int
    dead_letters: tuple[DeadLetter, ...] = ()
    tokens: int = 0
    requests: int = 0
    created: bool = True
    inputs: int = 0  # texts sent to the API (requests' inputs, first attempts)
    reused: int = 0  # rows whose vector was copied from an object of an earlier run
    deduplicated: int = 0  # rows whose text this run embeds once for another row
    tokens_saved: int = 0  # estimated tokens (``estimate_tokens``) of reused+deduplicated rows
    dimensions: int | None = None  # the object's vector length (None: not read yet)
    rows_sent: int | None = None  # rows the server embedded for the object (None: unknown)
    batch_tokens: int = 0  # of ``tokens``: those answered by Batch API batches (half price)
    rows_xor: str | None = None  # the object's ``rows_fingerprint`` (None: not read yet)
    batch_inputs: int = 0  # of ``inputs``: the texts Batch API batches answered


@dataclass(frozen=True, slots=True)
class ReuseSource:
    """Rows of a chunk whose text an earlier chunk of this run embeds (its *owner*).

    ``rows`` are 0-based positions within the chunk; ``object_key`` is the owner's chunk
    object, where the task waits for them and matches them by ``text_sha256``. ``heirs``
    (empty, or one entry per row): the objects of the chunks that hold that row's text
    after the owner and before this one (in order, at most 16), of which the first still
    running embeds it if the owner fails; the task then waits for those objects in turn
    before sending the text itself.
    """

    object_key: str
    rows: tuple[int, ...]
    heirs: tuple[tuple[str, ...], ...] = ()  # per row: who embeds it if the owner fails


@dataclass(frozen=True, slots=True)
class ReusePlan:
    """What a chunk task need not send: decided by the flow process (``tasks/reuse/row_sources``).

    Small (a file path, object keys and row positions; no vectors, no text), so it travels
    to Dask workers. ``prefill`` is the local file of vectors the reuse stage copied for
    this chunk (``tasks.reuse.gather.Prefill``, vectors ``width`` long; None: nothing copied) —
    or, for workers that do not share the flow process's disk (``--dask-address``),
    ``copies``, that file's bytes (a few MB: 5,000 rows of 64 dims are 1.4 MB); ``sources``
    are the in-run owners it waits for. Rows covered by neither are embedded (and
    deduplicated within the chunk).
    """

    sources: tuple[ReuseSource, ...] = ()
    session: str = ""  # the planning process's token: names its gave-up marks (tasks/embed/paid.py)
    prefill: str | None = None
    width: int | None = None
    copies: bytes | None = field(default=None, repr=False)


#: The requests of a Batch API batch, in order: ``(custom_id, row positions)`` each, the
#: positions 0-based within the chunk's rows (ids and ints only: no text).
BatchLayout = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class ChunkBatches:
    """What a chunk task reads its Batch API answers from (``--batch-api``).

    ``files``: the output and error file ids of every batch of the chunk; ``layout``: every
    request those batches carried, as the ledger recorded it when each batch was submitted
    (``BatchLayout``), so answers are matched to rows whatever batching settings the run
    has now. Small, so it travels to Dask workers.
    """

    files: tuple[str, ...] = ()
    layout: BatchLayout = ()


@dataclass(frozen=True, slots=True)
class ManifestChunk:
    """One entry of ``manifest.chunks`` (docs/reference/output-layout.md): the object, its
    SHA-256, ``rows`` the run takes from it and ``drop_ids``, the ids of the object's rows
    the run does not take (an object inherited from an earlier run whose rows this run
    changed or removed: docs/reference/output-layout.md, "Delta nights")."""

    index: int
    key: str
    object: str
    rows: int
    sha256: str
    drop_ids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, builtins.object]:
        """Return the entry as a JSON-ready dict (``drop_ids`` only when there are some)."""
        entry = asdict(self)
        if self.drop_ids:
            entry["drop_ids"] = list(self.drop_ids)
        else:
            del entry["drop_ids"]
        return entry

    @classmethod
    def from_dict(cls, entry: dict[str, builtins.object]) -> ManifestChunk:
        """The entry of a manifest read back (v1/v2; ``drop_ids`` absent: none)."""
        return cls(
            int(str(entry["index"])),
            str(entry["key"]),
            str(entry["object"]),
            int(str(entry["rows"])),
            str(entry["sha256"]),
            tuple(str(i) for i in entry.get("drop_ids") or ()),  # type: ignore[attr-defined]
        )


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
    rows: int, *, estimated: int, tokens: int, inputs: int, rows_total: int
) -> dict[str, int | bool]:
    """The ``tokens_saved`` of ``rows`` rows that reuse and deduplication kept from the API,
    and whether it is measured (``tokens_saved_measured``).

    Measured when the run has reported tokens for charged inputs: ``rows`` times this run's
    tokens per input, never more than that rate gives for all ``rows_total`` rows. Otherwise
    ``estimated`` (``estimate_tokens`` of the rows' texts: UTF-8 bytes / 3, above what
    English costs), an upper bound, not measured.
    """
    rows = max(0, min(rows, rows_total))
    if tokens > 0 and inputs > 0:
        per_input = tokens / inputs
        saved = min(round(rows * per_input), round(rows_total * per_input))
        return {"tokens_saved": saved, "tokens_saved_measured": True}
    return {"tokens_saved": estimated if rows else 0, "tokens_saved_measured": False}


def saved_phrase(
    *, rows: int, tokens_saved: int, measured: bool, tokens: int, inputs: int, price: float | None
) -> str:
    """What reuse and deduplication avoided, for the summaries: the ``rows`` not sent and
    their tokens (``tokens_avoided``: ``measured`` at this run's ``tokens`` per charged
    input, else the byte estimate, an upper bound), priced at ``price`` (USD per 1M tokens)
    when given."""
    if not rows:
        return "nothing (no row reused or deduplicated)"
    money = f"{usd(tokens_saved * price / 1e6)}: " if price is not None else ""
    if measured:
        return (
            f"{money}{tokens_saved:,} tokens for {rows:,} rows not sent (at this run's "
            f"{tokens / max(inputs, 1):,.1f} tokens per input)"
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
    # tokens reuse and deduplication avoided (``tokens_avoided``): measured at this run's
    # reported tokens per charged input, or (``tokens_saved_measured`` False: nothing was
    # charged to measure) the byte estimate, an upper bound
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


def shown_id(row_id: str) -> str:
    """An id for a log line or message: repr-quoted (a NUL shows as ``\\x00``), at most 40
    characters, with its length when cut."""
    text = repr(row_id)
    return text if len(text) <= 40 else f"{text[:37]}... ({len(row_id):,} characters)"


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
