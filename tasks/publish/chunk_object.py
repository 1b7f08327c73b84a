"""Publish a chunk: one Parquet object per chunk, created once under its content key.

Object layout (docs/reference/output-layout.md): columns ``id`` (string), ``embedding`` (fixed-size
list of float32, length = dimensions), ``text_sha256`` (string), ``idempotency_key`` (string), then
the kept columns under their CSV names and, with ``--keep-text``, ``text`` (strings, exactly
as read or composed); rows in input order, dead letters left out. The Parquet key-value metadata
carries the chunk key,
model, dimensions, row counts and dead letters (row, id, reason, HTTP status; never text), so
the store alone tells a chunk's outcome.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adapters.object_store import check_conditional_writes
from adapters.scratch import digests
from embedline.errors import BadResponseError, ConflictError, FatalError
from embedline.models import ChunkOutcome, ChunkSpec, DeadLetter
from embedline.protocols import ObjectStore
from tasks.embed.rows import EmbeddedRows

__all__ = [
    "CHUNK_FORMAT",
    "ChunkMetadata",
    "adopt_existing",
    "chunk_parquet",
    "ensure_conditional_writes",
    "publish_chunk",
    "read_chunk_metadata",
    "rows_fingerprint",
]

CHUNK_FORMAT = "embedline.chunk.v1"
PARQUET_CONTENT_TYPE = "application/vnd.apache.parquet"
_META_KEY = b"embedline"


@dataclass(frozen=True, slots=True)
class ChunkMetadata:
    """What a chunk object says about itself (from its Parquet key-value metadata)."""

    chunk_key: str
    model: str
    dimensions: int
    rows: int
    first_row: int  # 1-based record number of the chunk's first row in the writing run
    dead_letters: tuple[DeadLetter, ...]
    request_settings: str = ""  # RunSettings.request_fingerprint, kept when dead letters exist
    rows_sent: int | None = None  # rows whose vectors the server sent for it (None: older object)
    rows_xor: str | None = None  # ``rows_fingerprint`` of its rows (None: an older object)


def chunk_parquet(
    spec: ChunkSpec,
    embedded: EmbeddedRows,
    *,
    model: str,
    dimensions: int,
    request_settings: str = "",
    rows_sent: int | None = None,
    kept_columns: Sequence[str] = (),
    keep_text: bool = False,
) -> bytes:
    """Return the chunk's Parquet bytes (deterministic for the same vectors).

    ``dimensions`` is the vectors' length (used for a 0-row chunk's schema); ``rows_sent``
    the rows the server embedded for this object (the others reused or copied), recorded so
    a rerun can tell which length the server gave (``tasks.publish.dimensions``). ``kept_columns``
    name the rows' ``kept`` values (one string column each, after embedline's own);
    ``keep_text`` adds the rows' text as column ``text``.

    :raises BadResponseError: a vector holds NaN or Inf (nothing is published).
    """
    rows = embedded.rows
    extra = {name: [r.kept[position] for r in rows] for position, name in enumerate(kept_columns)}
    if keep_text:
        extra["text"] = [r.text for r in rows]
    return chunk_parquet_columns(
        spec,
        [r.id for r in rows],
        [r.text_sha256 for r in rows],
        embedded.row_keys,
        embedded.vectors,
        embedded.dead_letters,
        model=model,
        dimensions=dimensions,
        request_settings=request_settings,
        rows_sent=rows_sent,
        extra=extra,
    )


def chunk_parquet_columns(
    spec: ChunkSpec,
    ids: Sequence[str] | pa.Array,
    text_hashes: Sequence[str] | pa.Array,
    row_keys: Sequence[str] | pa.Array,
    vectors: np.ndarray,
    dead_letters: Sequence[DeadLetter],
    *,
    model: str,
    dimensions: int,
    request_settings: str = "",
    rows_sent: int | None = None,
    extra: dict[str, list[str]] | None = None,
    rows_xor: str | None = None,
    memory_pool: pa.MemoryPool | None = None,
) -> bytes:
    """``chunk_parquet`` from its columns: ``ids``, ``text_hashes`` and ``row_keys`` (one
    string each per published row; lists or Arrow string arrays), ``vectors`` float32 ``(rows,
    dimensions)``, the
    chunk's ``dead_letters``, and ``extra`` string columns after embedline's own (kept
    columns, then ``text``; their names go in the metadata as ``kept_columns`` /
    ``keep_text``); ``rows_xor``: ``rows_fingerprint(row_keys)`` if the caller has it;
    ``memory_pool``: the Arrow pool of the writer's buffers (default: the process's;
    ``reusing_pool()`` for a thread that writes one chunk after another).

    :raises BadResponseError: a vector holds NaN or Inf (nothing is published).
    """
    if not np.isfinite(vectors).all():
        raise BadResponseError(f"chunk {spec.index}: embeddings hold NaN or Inf values")
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    table = pa.table(
        {
            "id": _strings(ids),
            "embedding": _embedding_column(flat, dimensions),
            "text_sha256": _strings(text_hashes),
            "idempotency_key": _strings(row_keys),
        }
    )
    extra = extra or {}
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values, type=pa.string()))
    kept_columns = [name for name in extra if name != "text"]
    keep_text = "text" in extra
    meta = {
        "format": CHUNK_FORMAT,
        "chunk_key": spec.key,
        "model": model,
        "dimensions": dimensions,
        "rows": len(ids),
        "rows_total": spec.rows,
        "first_row": spec.first_row,
        "dead_letters": [d.to_dict() for d in dead_letters],
        "rows_xor": rows_xor or rows_fingerprint(row_keys),
    }
    # what a rerun compares (docs/reference/output-layout.md, "Generations")
    if dead_letters and request_settings:
        meta["request_settings"] = request_settings
    if rows_sent is not None:
        meta["rows_sent"] = rows_sent
    if kept_columns:
        meta["kept_columns"] = list(kept_columns)
    if keep_text:
        meta["keep_text"] = True
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta, sort_keys=True).encode()})
    pool = memory_pool or pa.default_memory_pool()
    sink = pa.BufferOutputStream(memory_pool=pool)
    # No dictionary encoding: every id and hash is unique, and dictionary-encoding 384k floats
    # per chunk tripled the write time and the Arrow pool's peak (measured: 25 MB vs 7 MB).
    # The vectors are stored uncompressed: float32 noise gains zstd 7 % of the bytes for a
    # third of the write's CPU (5,000 x 64 dims: 6.8 -> 5.1 ms, 1,508 -> 1,619 KiB).
    codecs = dict.fromkeys(table.column_names, "zstd") | {"embedding": "none"}
    # write_batch_size counts the embedding's floats: at the default 1,024, a 5,000 x 64
    # chunk is written in 313 batches; at 64Ki in 5, a quarter less CPU (4.0 -> 3.1 ms),
    # the same bytes.
    pq.write_table(
        table,
        sink,
        compression=codecs,
        use_dictionary=False,
        write_statistics=["id"],
        memory_pool=pool,
        write_batch_size=1 << 16,
    )
    body: bytes = sink.getvalue().to_pybytes()
    return body


@functools.cache
def reusing_pool() -> pa.MemoryPool:
    """An Arrow pool that reuses freed pages (jemalloc where the wheel has it), for the
    Parquet writer's buffers on a thread that writes chunk after chunk
    (``tasks.reuse.copied_chunk``): several MB a chunk, made and freed each time, which the
    process's default pool (``system``, chosen to keep memory flat: ``adapters.memory``) maps and
    faults in afresh above glibc's 1 MiB mmap threshold (a chunk of 5,000 x 64 dims: 1,077 page
    faults, 286 with this pool). Not for the chunk tasks: nine of them at once would each keep
    their pages."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a build without jemalloc (Windows wheels)
        return pa.default_memory_pool()


def rows_fingerprint(row_keys: Sequence[str] | pa.Array) -> str:
    """An order-free fingerprint of a set of rows: the XOR of the first 8 bytes of their
    row keys (docs/reference/keys.md: a row key hashes the id and the text's hash, for one model and
    requested dimensions), 16 hex digits; XORs of chunks combine into a run's. Two runs of
    the same dataset whose fingerprints and row counts agree hold the same (id, text)
    pairs but for a 2^-64 chance: the commit then skips reading every row for the change
    set (``tasks.commit.commit_run``). Ids are unique within a run, so no row cancels another."""
    return fold_fingerprint(digests(row_keys))


def fold_fingerprint(raw: np.ndarray) -> str:
    """``rows_fingerprint`` of row keys given as raw digests: ``uint8`` ``(n, 32)``."""
    folded = raw[:, :8].copy().view("<u8").ravel()
    return f"{int(np.bitwise_xor.reduce(folded)) if len(folded) else 0:016x}"


def _strings(values: Sequence[str] | pa.Array) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, type=pa.string())


def _embedding_column(flat: pa.Array, dimensions: int) -> pa.Array:
    """Fixed-size lists of ``dimensions`` float32. A 0-row chunk whose length nobody knows
    (every text empty, no ``--dimensions``, nothing embedded yet) gets a variable-size list:
    Arrow has no fixed-size list of length 0 (docs/reference/output-layout.md)."""
    if dimensions > 0:
        return pa.FixedSizeListArray.from_arrays(flat, dimensions)
    return pa.array([], type=pa.list_(pa.float32()))


def read_chunk_metadata(body: bytes | pa.Schema) -> ChunkMetadata:
    """Parse a chunk object's embedline metadata (from its bytes, or its Arrow schema).

    :raises ValueError: the bytes are not a Parquet file written by embedline.
    """
    try:
        schema = body if isinstance(body, pa.Schema) else pq.read_schema(io.BytesIO(body))
        meta = json.loads((schema.metadata or {})[_META_KEY])
    except (pa.ArrowInvalid, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an embedline chunk object: {exc}") from None
    if meta.get("format") != CHUNK_FORMAT:
        raise ValueError(f"unknown chunk format {meta.get('format')!r}")
    return ChunkMetadata(
        chunk_key=meta["chunk_key"],
        model=meta["model"],
        dimensions=int(meta["dimensions"]),
        rows=int(meta["rows"]),
        first_row=int(meta["first_row"]),
        dead_letters=tuple(DeadLetter(**d) for d in meta["dead_letters"]),
        request_settings=str(meta.get("request_settings", "")),
        rows_sent=int(meta["rows_sent"]) if "rows_sent" in meta else None,
        rows_xor=str(meta["rows_xor"]) if "rows_xor" in meta else None,
    )


def publish_chunk(
    store: ObjectStore,
    spec: ChunkSpec,
    embedded: EmbeddedRows,
    *,
    model: str,
    dimensions: int,
    request_settings: str = "",
    rows_sent: int | None = None,
    kept_columns: Sequence[str] = (),
    keep_text: bool = False,
) -> ChunkOutcome:
    """Create the chunk's object with a conditional create; never overwrite (layout and
    ``kept_columns``/``keep_text``: ``chunk_parquet``).

    If an object already exists at the key with other bytes, it is adopted when it is an
    embedline chunk of the same chunk key and model (another run embedded the same content;
    embedding APIs are not bit-for-bit deterministic). Anything else is a conflict.

    :raises ConflictError: the key holds an object that is not this chunk.
    :raises BadResponseError: NaN/Inf in the vectors.
    """
    body = chunk_parquet(
        spec,
        embedded,
        model=model,
        dimensions=dimensions,
        request_settings=request_settings,
        rows_sent=rows_sent,
        kept_columns=kept_columns,
        keep_text=keep_text,
    )
    return publish_body(
        store,
        spec,
        body,
        rows=len(embedded.rows),
        dead_letters=embedded.dead_letters,
        model=model,
        dimensions=dimensions,
        tokens=embedded.tokens,
        requests=embedded.requests,
        rows_sent=rows_sent,
        rows_xor=rows_fingerprint(embedded.row_keys),
    )


def publish_body(
    store: ObjectStore,
    spec: ChunkSpec,
    body: bytes,
    *,
    rows: int,
    dead_letters: Sequence[DeadLetter],
    model: str,
    dimensions: int,
    tokens: int = 0,
    requests: int = 0,
    rows_sent: int | None = None,
    rows_xor: str | None = None,
) -> ChunkOutcome:
    """``publish_chunk`` of a chunk object already built (``chunk_parquet`` or
    ``chunk_parquet_columns``) holding ``rows`` rows (``rows_xor``: their fingerprint, as
    in the object). Raises as ``publish_chunk``."""
    digest = hashlib.sha256(body).hexdigest()
    outcome = ChunkOutcome(
        index=spec.index,
        key=spec.key,
        object_key=spec.object_key,
        object_sha256=digest,
        rows=rows,
        dead_letters=tuple(dead_letters),
        tokens=tokens,
        requests=requests,
        dimensions=dimensions if rows else None,
        rows_sent=rows_sent,
        rows_xor=rows_xor,
    )
    try:
        put = store.put_if_absent(
            spec.object_key, body, sha256=digest, content_type=PARQUET_CONTENT_TYPE
        )
    except ConflictError:
        return adopt_existing(store, spec, model=model, tokens=tokens, requests=requests)
    if put.created:
        return outcome
    return replace(outcome, created=False)


def adopt_existing(
    store: ObjectStore, spec: ChunkSpec, *, model: str, tokens: int = 0, requests: int = 0
) -> ChunkOutcome:
    """Describe the object already stored for ``spec`` (published by this or another run).

    :raises ConflictError: the object is not an embedline chunk of ``spec.key`` and ``model``.
    :raises FileNotFoundError: no object exists at the key.
    """
    body = store.get(spec.object_key)
    try:
        meta = read_chunk_metadata(body)
    except ValueError as exc:
        raise ConflictError(
            f"{store.uri_for(spec.object_key)} exists and is not an embedline chunk ({exc}); "
            "it was not overwritten: remove it or choose another --output",
            chunk_index=spec.index,
        ) from None
    if meta.chunk_key != spec.key or meta.model != model:
        raise ConflictError(
            f"{store.uri_for(spec.object_key)} holds chunk {meta.chunk_key[:12]} of model "
            f"{meta.model!r}, not this chunk; it was not overwritten",
            chunk_index=spec.index,
        )
    return ChunkOutcome(
        index=spec.index,
        key=spec.key,
        object_key=spec.object_key,
        object_sha256=hashlib.sha256(body).hexdigest(),
        rows=meta.rows,
        dead_letters=tuple(
            replace(d, row_number=spec.first_row + d.row_number - meta.first_row)
            for d in meta.dead_letters
        ),
        tokens=tokens,
        requests=requests,
        created=False,
        dimensions=meta.dimensions if meta.rows else None,
        rows_sent=meta.rows_sent,
    )


_checked_stores: set[str] = set()


def ensure_conditional_writes(store: ObjectStore, *, allow_unconditional: bool) -> str | None:
    """Check once per process that ``store`` refuses to overwrite; return a warning or None.

    Probes with two conditional creates of a scratch key (``check_conditional_writes``), and
    on a local directory removes temp files left by killed writers first.

    :raises FatalError: the store overwrote the scratch key and ``allow_unconditional`` is
        False (exactly-once publishing would not be guaranteed).
    """
    store.sweep_temp_files()
    if store.uri in _checked_stores:
        return None
    if check_conditional_writes(store):
        _checked_stores.add(store.uri)
        return None
    message = (
        f"{store.uri} does not enforce conditional writes (If-None-Match: *): a concurrent "
        "or retried publish could overwrite a chunk"
    )
    if not allow_unconditional:
        raise FatalError(
            f"{message}; use a store that does, or pass --allow-unconditional-store to run anyway"
        )
    return f"{message}. RUNNING ANYWAY because --allow-unconditional-store was given."
