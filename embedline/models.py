"""Plain records passed between stages: plan → embed → publish → record.

Frozen, slotted dataclasses (picklable, so Prefect and Dask can ship them). None of them
holds a secret; only ``Row`` holds input text, and its ``repr`` leaves the text out.
"""

from __future__ import annotations

import builtins
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from embedline.keys import columns_lines, cut_text

__all__ = [
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
    "ManifestChunk",
    "ReusePlan",
    "ReuseSource",
    "Row",
    "blocking_dead_letters",
    "chunk_generation",
    "chunk_object_key",
    "committed_dead_letters_note",
    "compose_text",
    "dead_letters_block_message",
    "dead_letters_phrase",
    "empty_texts_phrase",
    "manifest_object_key",
    "shown_id",
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


def compose_text(
    fields: Sequence[str],
    parts: Sequence[tuple[str, int]],
    text_index: int,
    normalize: Literal["none", "NFC", "NFKC"],
    truncate_bytes: int | None,
) -> str:
    """A record's text as embedded (docs/reference/keys.md, "Documents"): the template's
    ``parts`` (literal, field position; -1 for a trailing literal) composed from ``fields``,
    or the field at ``text_index`` without parts; in the Unicode form ``normalize``
    (``none``: as read); cut to ``truncate_bytes`` UTF-8 bytes (``keys.cut_text``)."""
    if not parts:
        text = fields[text_index]
    else:
        text = "".join(literal + (fields[i] if i >= 0 else "") for literal, i in parts)
    if normalize != "none":
        text = unicodedata.normalize(normalize, text)
    return cut_text(text, truncate_bytes)


@dataclass(frozen=True, slots=True)
class InputSource:
    """Where the CSV is (a local path or ``s3://`` URI) and how its records map to ids and texts.

    ``encoding`` is a Python codec name (``utf-8``, ``cp932``); ``data_start`` is the byte
    offset of the first data record (after the header); ``id_index``/``text_index`` are
    0-based field positions; ``n_fields`` is the header's width. ``quoting`` is how fields
    are split (``minimal`` or ``none``: ``adapters.csv_format.QUOTING``); ``normalize`` the
    Unicode form the composed text is put in (``NFC``, ``NFKC``; ``none``: as read);
    ``truncate_bytes`` the UTF-8 bytes a text is cut to after that (``keys.cut_text``; None:
    whole; ``--on-too-long truncate``).
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
    truncate_bytes: int | None = None  # docs/reference/keys.md, "Documents"

    def text_of(self, fields: Sequence[str]) -> str:
        """A record's text: the template composed from ``fields``, or its text field, in the
        Unicode form ``normalize``, cut to ``truncate_bytes``."""
        return compose_text(
            fields, self.text_parts, self.text_index, self.normalize, self.truncate_bytes
        )

    def kept_of(self, fields: Sequence[str]) -> tuple[str, ...]:
        """A record's kept values, exactly as read (empty without kept columns)."""
        return tuple(fields[i] for i in self.kept_indexes)

    @property
    def key_lines(self) -> list[str]:
        """The documents lines of the run and chunk keys (``keys.columns_lines``)."""
        return columns_lines(
            self.text_template,
            self.kept_columns,
            self.keep_text,
            self.normalize,
            self.truncate_bytes,
        )

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """The columns a chunk object has after embedline's own: the kept columns, then
        ``text`` with ``keep_text`` (docs/reference/output-layout.md)."""
        return self.kept_columns + (("text",) if self.keep_text else ())


@dataclass(frozen=True, slots=True)
class ChunkPart:
    """The rows a delta chunk takes from one planned chunk (docs/design.md, "Delta nights"):
    the planned chunk's records (fields as ``ChunkSpec``'s) and the 0-based ``positions``
    among them that it takes, ascending; ``lines`` and ``last_lines``, the physical lines
    where each of those records starts and ends, let a reader parse only them (empty:
    the planned chunk is parsed up to the last position)."""

    first_row: int
    line_start: int
    rows: int
    byte_start: int
    byte_stop: int
    bytes_sha256: str
    positions: tuple[int, ...]
    lines: tuple[int, ...] = ()
    last_lines: tuple[int, ...] = ()


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
    # a delta chunk: ``keys.rows_sha256`` of its rows, which its reader checks in place of
    # each part's ``bytes_sha256`` (so it parses and checks only the records it takes)
    rows_sha256: str = ""

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
    # ``approximate_tokens`` of the texts whose answers reported usage (``tokens``): a run
    # adds both to the ledger's token calibration (``embedline.calibration``)
    tokens_estimated: int = 0
    # ``estimate_tokens`` (UTF-8 bytes / 3) of the same texts: scales ``tokens_saved``, counted
    # in that unit, to what the server reports (``embedline.summary.tokens_avoided``)
    tokens_bound: int = 0


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
    has now; ``chunk``: the chunk's index, which names its lines in a batch that packs many
    chunks (None: every line is the chunk's). Small, so it travels to Dask workers.
    """

    files: tuple[str, ...] = ()
    layout: BatchLayout = ()
    chunk: int | None = None


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


def shown_id(row_id: str) -> str:
    """An id for a log line or message: repr-quoted (a NUL shows as ``\\x00``), at most 40
    characters, with its length when cut."""
    text = repr(row_id)
    return text if len(text) <= 40 else f"{text[:37]}... ({len(row_id):,} characters)"
