"""Content keys: SHA-256 hex digests that make every output idempotent.

All keys follow ``docs/reference/keys.md`` (a contract: outside checks recompute them).

- ``text_sha256(text)``: the exact text as embedded (read, or composed, normalized and cut as
  the documents lines below say), UTF-8, no trimming.
- ``row_key``: ``sha256("{id}\\x1f{text_sha256}\\x1f{model}\\x1f{dimensions}")``.
- ``request_key``: sha256 of a request's row keys joined by ``\\n`` (the ``Idempotency-Key``
  header), so every attempt of the same request, in this process or after a crash, carries
  the same key.
- ``ChunkKeyBuilder`` / ``chunk_key``: ``sha256("\\n".join(["chunk.v1", model, dims] +
  ["{id}\\x1f{text_sha256}", ...]))``, built incrementally so planning never holds a chunk.
- ``run_key``: ``sha256("\\n".join(["run.v1", input_sha256, id_column, text_column, model,
  dims, str(chunk_size)]))``; generation N >= 1 of a run (a committed run whose dead letters
  were sent again, docs/reference/output-layout.md, "Generations") appends ``"g{N}"`` as a last
  line.
- Documents (docs/reference/keys.md): a run with a text template other than ``{text_column}``,
  kept columns, ``--keep-text``, ``--normalize NFC|NFKC`` or ``--on-too-long truncate``
  appends ``columns_lines`` to the run key (before ``g{N}``) and to the chunk key's header,
  and each chunk-key row line then also carries ``kept_sha256`` of the row's kept values.
  Without them the keys are exactly those above.

An unset ``dimensions`` (``None``) is the empty string everywhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

__all__ = [
    "ChunkKeyBuilder",
    "chunk_key",
    "columns_lines",
    "cut_text",
    "dims_text",
    "request_key",
    "row_key",
    "row_key_digests",
    "row_keys",
    "rows_sha256",
    "run_key",
    "text_sha256",
]

_SEP = "\x1f"  # ASCII unit separator: cannot collide with a CSV field boundary


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dims_text(dimensions: int | None) -> str:
    """Return ``dimensions`` as decimal text, or ``""`` when unset (docs/reference/keys.md)."""
    return "" if dimensions is None else str(int(dimensions))


def text_sha256(text: str) -> str:
    """Return the lowercase hex SHA-256 of ``text`` encoded as UTF-8 (64 chars)."""
    return _sha256(text)


def cut_text(text: str, max_bytes: int | None) -> str:
    """``text`` cut to its first ``max_bytes`` UTF-8 bytes, less a character the cut would
    split (docs/reference/keys.md, "Documents": ``truncate:``); whole when it fits or
    ``max_bytes`` is None. The cut text is what a truncating run hashes and sends."""
    if max_bytes is None or len(text) * 4 <= max_bytes:  # 4 bytes a character at most
        return text
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    return raw[:max_bytes].decode("utf-8", errors="ignore")


def row_key(row_id: str, text_hash: str, model: str, dimensions: int | None) -> str:
    """Return a row's idempotency key (64 hex chars) from its id and ``text_sha256``."""
    return _sha256(_SEP.join((row_id, text_hash, model, dims_text(dimensions))))


def row_keys(
    row_ids: Iterable[str], text_hashes: Iterable[str], model: str, dimensions: int | None
) -> list[str]:
    """``row_key`` of each (id, text hash) pair, in order: the same keys in a third less
    time (no call per row; at a million rows a chunk's keys cost seconds)."""
    tail = f"{_SEP}{model}{_SEP}{dims_text(dimensions)}"
    sha256 = hashlib.sha256
    return [
        sha256(f"{i}{_SEP}{h}{tail}".encode()).hexdigest()
        for i, h in zip(row_ids, text_hashes, strict=True)
    ]


def row_key_digests(
    row_ids: Iterable[str], text_hashes: Iterable[str], model: str, dimensions: int | None
) -> bytes:
    """The 32-byte SHA-256 of each ``row_key``, in order, back to back (``32 * n`` bytes):
    ``row_keys`` without a hex string per row, for a caller that hexes them all at once
    (``adapters.scratch.hex_digests``) and folds them into a fingerprint."""
    tail = f"{_SEP}{model}{_SEP}{dims_text(dimensions)}"
    sha256 = hashlib.sha256
    return b"".join(
        [
            sha256(f"{i}{_SEP}{h}{tail}".encode()).digest()
            for i, h in zip(row_ids, text_hashes, strict=True)
        ]
    )


def request_key(row_keys: Sequence[str]) -> str:
    """Return the ``Idempotency-Key`` of a request carrying ``row_keys`` in order.

    :raises ValueError: if ``row_keys`` is empty (an empty request is never sent).
    """
    if not row_keys:
        raise ValueError("a request needs at least one row key")
    return _sha256("\n".join(row_keys))


def columns_lines(
    text_template: str | None,
    kept_columns: Sequence[str] = (),
    keep_text: bool = False,
    normalize: str = "none",
    truncate_bytes: int | None = None,
) -> list[str]:
    """The key lines of a run's documents settings (docs/reference/keys.md): ``template:`` and the
    JSON of ``text_template`` (None: the plain text column, no line), ``keep:`` and the JSON list
    of ``kept_columns`` (none: no line), ``keep_text`` when the text is kept, ``normalize:`` and
    the Unicode form (``NFC``, ``NFKC``; ``none``: no line). JSON so that a template's newlines
    stay inside its one line. The same input bytes give other texts in another form, so the
    form is in the keys; ``text_sha256`` is of the normalized text, so reuse across forms
    happens exactly where the texts are equal. ``truncate:`` and ``truncate_bytes`` when texts
    are cut to that many UTF-8 bytes (``cut_text``; None: no line): ``text_sha256`` is of the
    cut text, so a truncated vector is never taken for its whole text's."""
    lines = []
    if text_template is not None:
        lines.append("template:" + json.dumps(text_template, ensure_ascii=False))
    if kept_columns:
        lines.append("keep:" + json.dumps(list(kept_columns), ensure_ascii=False))
    if keep_text:
        lines.append("keep_text")
    if normalize != "none":
        lines.append("normalize:" + normalize)
    if truncate_bytes is not None:
        lines.append(f"truncate:{int(truncate_bytes)}")
    return lines


def _line(fields: str) -> str:
    return "\n" + fields


class ChunkKeyBuilder:
    """Incremental chunk key: feed ``(id, text_sha256)`` pairs in input order (with kept
    columns, also each row's ``kept_sha256``).

    Hashes the same bytes as ``chunk_key`` without keeping the rows, so a planning pass over a
    file of any size holds one hash object per open chunk. ``columns`` are
    ``columns_lines`` (empty: the key is exactly the one without documents settings).
    """

    __slots__ = ("_hash", "rows")

    def __init__(self, model: str, dimensions: int | None, columns: Sequence[str] = ()) -> None:
        self._start("\n".join(["chunk.v1", model, dims_text(dimensions), *columns]))

    def _start(self, head: str) -> None:
        self._hash = hashlib.sha256(head.encode())
        self.rows = 0

    @classmethod
    def rows_only(cls) -> ChunkKeyBuilder:
        """A builder of ``rows_sha256``: the same row lines under the head ``rows.v1``, with no
        model, dimensions nor columns (what a chunk reader can check without the settings)."""
        builder = cls.__new__(cls)
        builder._start("rows.v1")
        return builder

    def add(self, row_id: str, text_hash: str, kept_hash: str | None = None) -> None:
        """Append one row (its id, the hex SHA-256 of its text, and with kept columns the
        ``template.kept_sha256`` of its kept values)."""
        line = f"\n{row_id}{_SEP}{text_hash}"
        if kept_hash is not None:
            line += f"{_SEP}{kept_hash}"
        self._hash.update(line.encode())
        self.rows += 1

    def add_many(
        self,
        row_ids: Sequence[str],
        text_hashes: Sequence[str],
        kept_hashes: Sequence[str] | None = None,
    ) -> None:
        """``add`` for many rows in order, in one hash update (the same bytes).

        :raises ValueError: the sequences differ in length (a row without its hash)."""
        rows = (
            zip(row_ids, text_hashes, kept_hashes, strict=True)
            if kept_hashes is not None
            else zip(row_ids, text_hashes, strict=True)
        )
        self._hash.update("".join(map(_line, map(_SEP.join, rows))).encode())
        self.rows += len(row_ids)

    def hexdigest(self) -> str:
        """Return the chunk key for the rows added so far (64 hex chars)."""
        return self._hash.hexdigest()


def rows_sha256(
    row_ids: Sequence[str],
    text_hashes: Sequence[str],
    kept_hashes: Sequence[str] | None = None,
) -> str:
    """The hex SHA-256 of rows as a chunk key hashes them (``ChunkKeyBuilder.add_many``) under
    the head ``rows.v1``: a delta chunk's readers compare the rows they parsed with the
    planned ones by it (``adapters.csv_chunks``), reading no other row's bytes.

    :raises ValueError: the sequences differ in length."""
    builder = ChunkKeyBuilder.rows_only()
    builder.add_many(row_ids, text_hashes, kept_hashes)
    return builder.hexdigest()


def chunk_key(
    model: str, dimensions: int | None, rows: Iterable[Sequence[str]], columns: Sequence[str] = ()
) -> str:
    """Return the chunk key of ``rows``, an iterable of ``(id, text_sha256)`` (with kept
    columns ``(id, text_sha256, kept_sha256)``) in input order; ``columns`` as
    ``ChunkKeyBuilder``."""
    builder = ChunkKeyBuilder(model, dimensions, columns)
    for row in rows:
        builder.add(*row)
    return builder.hexdigest()


def run_key(
    input_sha256: str,
    id_column: str,
    text_column: str,
    model: str,
    dimensions: int | None,
    chunk_size: int,
    generation: int = 0,
    columns: Sequence[str] = (),
) -> str:
    """Return the run key (64 hex chars) naming the manifest ``manifests/{run_key}.json``.

    ``generation`` N >= 1 names the run that supersedes generation N-1 of the same input and
    settings by retrying its dead letters (docs/reference/output-layout.md, "Generations"); 0 is the
    run itself. ``columns`` are ``columns_lines`` of a run with a template, kept columns or the text
    kept (none: the key is exactly the one of a plain run).

    :raises ValueError: ``generation`` is negative.
    """
    if generation < 0:
        raise ValueError(f"generation must be >= 0, got {generation}")
    parts = [
        "run.v1",
        input_sha256,
        id_column,
        text_column,
        model,
        dims_text(dimensions),
        str(chunk_size),
    ]
    parts += list(columns)
    return _sha256("\n".join(parts + ([f"g{generation}"] if generation else [])))
