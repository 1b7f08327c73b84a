"""Planning a CSV input: one streaming pass validates it, hashes it and cuts it into chunks
at record boundaries, so that each chunk later reads only its own bytes (``adapters.csv_chunks``).

Why ``csv.reader`` and Arrow's CSV parser and not ``pandas.read_csv``: planning needs the
byte offset of every record boundary (so a chunk task can seek to its rows instead of
re-scanning the file) and the physical line where each record starts (for error messages).
pandas gives neither, and its type inference is the source of the classic bugs this module
must not have (``007`` read as 7, a trailing comma turning the id into the index, ``NA``
read as missing). ``csv.reader`` yields every field as the exact ``str`` written, in C, one
record at a time; where a block of records provably reads alike, Arrow's parser reads it as
string columns, faster (``adapters.csv_batches``), and the lines come from counting.

The format (encoding, newline, delimiter) is sniffed once per input by ``adapters.csv_format``;
physical lines are read by ``adapters.csv_lines`` (a block at a time where that reads alike,
else line by line) and records by ``adapters.csv_records``. Compressed input (``.gz``) is
decompressed as a stream by ``adapters.input_source``. The header is checked on its own before
a run starts by ``adapters.csv_header``; duplicate ids are confirmed by ``adapters.csv_duplicates``.
The plan ``embedline run`` made moments before its flow runs reaches the flow through the
command's session (``flows.session``), not through here.

Cost: one pass reads, hashes, decodes and parses the input in C a 1 MiB block at a time; the
Python work is per record (a text hash, and on ``csv.reader``'s path ``_plan_pass``'s loop:
checks, id digest, chunk key) or per block (Arrow's path: the checks on columns), plus a
byte-offset lookup per chunk. Measured by ``benchmarks/bench_planning.py``.

Memory: the pass holds one block and its text, one record and the list of chunk specs; the
per-row facts (id digests for the duplicate check, text hashes for reuse) go to a scratch
directory (``adapters.row_facts``), so memory does not grow with the rows.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator, Sequence
from hashlib import sha256
from typing import Any, Literal

from adapters.csv_batches import RecordBatch, RecordBlocks, RecordShape
from adapters.csv_batches import applies as batches_apply
from adapters.csv_duplicates import raise_on_duplicates
from adapters.csv_format import sniff_stream
from adapters.csv_header import template_of
from adapters.csv_lines import Blocks, Hashes, LineSource, NeedsLineReader
from adapters.csv_records import (
    Header,
    check_width,
    header_starts,
    open_lines,
    parse_header,
    read_header,
    read_records,
    refuse_repeated_header,
    row_id_of,
)
from adapters.input_source import open_input
from adapters.memory import large_buffers_reused
from adapters.row_facts import RowFacts
from adapters.scratch import Scratch
from embedline.errors import InputError
from embedline.keys import ChunkKeyBuilder, columns_lines
from embedline.models import ChunkSpec, InputPlan, InputSource, compose_text
from embedline.template import Template, kept_sha256

__all__ = ["plan_csv"]


class _Planner:
    """Accumulates chunk specs while records stream past (one open chunk at a time); each
    chunk's byte range and SHA-256 come from the line reader ``lines``.

    The planning loop appends each row to the open chunk's lists (``ids``, ``hashes``,
    ``sizes``, ``empties``, ``kept``: bound ``append`` methods, kept across chunks, since
    a method call per row was a third of the loop); ``close`` hashes the chunk key from
    them in one update and hands them to ``facts`` (``adapters.row_facts``)."""

    def __init__(
        self,
        lines: LineSource,
        facts: RowFacts,
        *,
        chunk_size: int,
        model: str,
        dimensions: int | None,
        columns: Sequence[str] = (),
    ) -> None:
        self.chunk_size = chunk_size
        self.model = model
        self.dimensions = dimensions
        self.columns = tuple(columns)  # keys.columns_lines: the chunk key's extra lines
        self.chunks: list[ChunkSpec] = []
        self.ids: list[str] = []
        self.hashes: list[str] = []
        self.sizes: array[int] = array("i")  # UTF-8 bytes of each text
        self.empties: list[int] = []  # positions of empty or whitespace-only texts
        self.kept: list[str] = []  # kept_sha256 of each row (with kept columns)
        self.lines: array[int] = array("q")  # the physical line where each record starts
        self.last_lines: array[int] = array("q")  # and where it ends
        self.filled = 0  # rows in the open chunk (kept here by ``add_batch`` only)
        self.any_text = False  # a text not empty nor whitespace was seen (``add_batch``)
        self._facts = facts
        self._lines = lines
        self._open(byte_start=0, line_start=1, first_row=1)

    def start(self, *, byte_start: int, line_start: int) -> None:
        """Begin the first chunk at the first data record (the header's bytes are in none)."""
        self._lines.begin(byte_start)
        self._open(byte_start=byte_start, line_start=line_start, first_row=1)

    def _open(self, *, byte_start: int, line_start: int, first_row: int) -> None:
        self._byte_start, self._line_start, self._first_row = byte_start, line_start, first_row

    def add_batch(self, batch: RecordBatch) -> None:
        """Append a block's records (``csv_batches``), closing each chunk that fills."""
        n, done = len(batch.ids), 0
        if len(batch.empties) < n:
            self.any_text = True
        while done < n:
            stop = done + min(self.chunk_size - self.filled, n - done)
            self.ids += batch.ids[done:stop]
            self.hashes += batch.hashes[done:stop]
            self.sizes.frombytes(batch.sizes[done:stop].astype("=i").tobytes())
            self.lines.frombytes(batch.lines[done:stop].astype("=q").tobytes())
            self.last_lines.frombytes(batch.last_lines[done:stop].astype("=q").tobytes())
            empties = batch.empties[(batch.empties >= done) & (batch.empties < stop)]
            self.empties += (empties - done + self.filled).tolist()
            self.filled += stop - done
            if self.filled == self.chunk_size:
                self.full(int(batch.last_lines[stop - 1]))
                self.filled = 0
            done = stop

    def full(self, last_line: int) -> None:
        """The open chunk holds ``chunk_size`` rows, the last ending on physical line
        ``last_line`` (the last line read): close it just after that record."""
        stop = self._lines.offset_after(last_line)
        self.close(stop=stop)
        self._open(
            byte_start=stop, line_start=last_line + 1, first_row=self._first_row + self.chunk_size
        )

    def close(self, *, stop: int) -> None:
        if not self.ids:
            return
        key = ChunkKeyBuilder(self.model, self.dimensions, self.columns)
        key.add_many(self.ids, self.hashes, self.kept if self.kept else None)
        index = len(self.chunks)
        self.chunks.append(
            ChunkSpec(
                index=index,
                key=key.hexdigest(),
                first_row=self._first_row,
                line_start=self._line_start,
                rows=len(self.ids),
                byte_start=self._byte_start,
                byte_stop=stop,
                bytes_sha256=self._lines.cut(stop),
            )
        )
        self._facts.add_chunk(
            index,
            self.ids,
            self.hashes,
            self.sizes,
            self.empties,
            self.kept or None,
            (self.lines, self.last_lines),
        )
        held = (self.ids, self.hashes, self.sizes, self.empties, self.kept)
        for rows in (*held, self.lines, self.last_lines):
            del rows[:]


def plan_csv(
    path: str | os.PathLike[str],
    *,
    id_column: str,
    text_column: str,
    codec: str,
    chunk_size: int,
    model: str,
    dimensions: int | None,
    delimiter: str = ",",
    text_template: str | None = None,
    keep_columns: Sequence[str] = (),
    keep_text: bool = False,
    quoting: str = "minimal",
    normalize: Literal["none", "NFC", "NFKC"] = "none",
    truncate_bytes: int | None = None,
    scratch_root: str | None = None,
    scratch: Scratch | None = None,
) -> InputPlan:
    """Stream ``path`` once: validate it, hash it and cut it into chunks of ``chunk_size`` rows.

    ``path`` is a local path, a ``file://`` URI or ``s3://bucket/key`` (streamed, not
    downloaded first), ``.gz`` for gzip (decompressed as a stream; hashes, sizes and offsets
    are of the decompressed bytes).

    ``codec`` is ``auto`` or a Python codec name (``embedline.settings.codec_for``);
    ``delimiter`` is ``auto`` or one character (``sniff_format``; a ``sep=X`` first line
    names it); ``quoting`` ``minimal`` (RFC 4180 quotes) or ``none`` (split on the delimiter
    only, quotes kept, a record per line). The plan's source records what was chosen
    (``encoding``, ``newline``, ``delimiter``, ``quoting``, ``note``). The plan holds the
    file's SHA-256, size (bytes), record count and one ``ChunkSpec`` per chunk, each with its
    content key (docs/reference/keys.md) and byte range.

    ``text_template`` (``embedline.template``; None: the ``text_column`` field) builds each
    row's text; ``keep_columns`` are read beside it and, like ``keep_text``, enter the chunk
    keys (``keys.columns_lines``). ``normalize`` (``NFC``, ``NFKC``; ``none``: as read) is
    the Unicode form each text is put in before it is hashed (and later sent); a form
    enters the keys too. ``truncate_bytes`` (None: texts whole) cuts each text to that many
    UTF-8 bytes after that (``keys.cut_text``, ``--on-too-long truncate``): the cut text is
    hashed, and the cut enters the keys.

    ``scratch_root`` (a directory, normally the ledger's): the pass keeps its per-row facts
    in a scratch directory under it (``adapters.row_facts``), so memory stays flat at any
    row count, and the plan's ``scratch`` names it (its ``rows`` spill feeds the reuse
    stage; release it with ``adapters.scratch.release``). Without it, id digests stay in
    memory (8 bytes a row) and the plan has no row hashes. ``scratch``: plan into this
    directory instead of a new one under ``scratch_root`` (the caller owns it: a failed
    plan leaves it to the caller to close).

    :raises InputError: (exit 2) a template column or kept column missing from the header
        (naming it, listing the header), unreadable file, UTF-16 file, undecodable bytes, missing or
        duplicated header column, malformed record, record with extra non-empty or missing
        fields, empty id, duplicate ids (the first few, with their lines), a header with no
        data rows under it, the header repeated among the data (two exports joined). Every
        message names the file and the physical line where the record starts.
    """
    args = (
        os.fspath(path),
        id_column,
        text_column,
        codec,
        chunk_size,
        model,
        dimensions,
        delimiter,
        text_template,
        tuple(keep_columns),
        keep_text,
        quoting,
        normalize,
        truncate_bytes,
        scratch_root,
    )
    return _plan_csv(*args, given=scratch)


def _plan_csv(
    path: str,
    id_column: str,
    text_column: str,
    codec: str,
    chunk_size: int,
    model: str,
    dimensions: int | None,
    delimiter: str,
    text_template: str | None,
    keep_columns: tuple[str, ...],
    keep_text: bool,
    quoting: str,
    normalize: Literal["none", "NFC", "NFKC"],
    truncate_bytes: int | None,
    scratch_root: str | None,
    *,
    given: Scratch | None = None,
) -> InputPlan:
    args = (
        path,
        id_column,
        text_column,
        codec,
        chunk_size,
        model,
        dimensions,
        delimiter,
        text_template,
        keep_columns,
        keep_text,
        quoting,
        normalize,
        truncate_bytes,
    )
    for fast in (True, False):
        if given is not None:
            given.reset()  # the caller's directory: emptied for this pass, never closed
        owned = Scratch.create(scratch_root) if given is None and scratch_root is not None else None
        try:
            with large_buffers_reused():
                return _plan_pass(*args, fast=fast, scratch=given or owned)
        except NeedsLineReader:  # undecodable bytes: the line reader names the first error
            assert fast, "the line reader never needs itself"
        except BaseException:
            if owned is not None:
                owned.close()
            raise
        if owned is not None:
            owned.close()
    raise AssertionError("unreachable")


def _plan_pass(
    path: str,
    id_column: str,
    text_column: str,
    codec: str,
    chunk_size: int,
    model: str,
    dimensions: int | None,
    delimiter: str,
    text_template: str | None,
    keep_columns: tuple[str, ...],
    keep_text: bool,
    quoting: str,
    normalize: Literal["none", "NFC", "NFKC"],
    truncate_bytes: int | None,
    *,
    fast: bool,
    scratch: Scratch | None,
) -> InputPlan:
    """One planning pass (``plan_csv``); ``fast``: read by blocks where that reads alike;
    the per-row facts go to ``scratch`` (``RowFacts``).

    :raises NeedsLineReader: ``fast`` met bytes it cannot decode.
    """
    source_path = path
    template = template_of(text_template)
    hashes = Hashes()
    facts = RowFacts(scratch)
    found = open_input(source_path)
    with found.open() as fh:
        source_path = found.uri
        fmt = sniff_stream(
            fh,
            source_path,
            codec,
            delimiter,
            id_column,
            template.columns[0] if template else text_column,
            quoting,
        )
        plain = not (template or keep_columns or normalize != "none")
        batches = fast and batches_apply(fmt.codec, fmt.quoting, fmt.delimiter, plain_text=plain)
        lines = open_lines(
            fh,
            source_path,
            fmt,
            hashes=hashes,
            fast=fast,
            blocks=RecordBlocks if batches else Blocks,
        )
        records = read_records(lines, source_path, fmt.delimiter, fmt.quoting)
        header_line, header_last_line, header_fields = read_header(records, fmt, source_path)
        header = parse_header(
            header_fields,
            id_column=id_column,
            text_column=text_column,
            path=source_path,
            template_columns=template.columns if template else (),
            keep_columns=keep_columns,
            line=header_line,
        )
        shape = _Shape(header, template, keep_columns, normalize, truncate_bytes)
        data_start = lines.offset_after(header_last_line)
        planner = _Planner(
            lines,
            facts,
            chunk_size=chunk_size,
            model=model,
            dimensions=dimensions,
            columns=columns_lines(
                text_template, keep_columns, keep_text, normalize, truncate_bytes
            ),
        )
        planner.start(byte_start=data_start, line_start=header_last_line + 1)
        width = len(header.names)
        if isinstance(lines, RecordBlocks):
            records = _add_batches(
                lines, planner, header, data_start, fmt.delimiter, source_path, truncate_bytes
            )
        any_text, filled = planner.any_text, planner.filled
        text_of, kept_hash, keeping = shape.text_of, shape.kept_hash, bool(keep_columns)
        id_index = header.id_index
        as_read = not (template or normalize != "none" or truncate_bytes is not None)
        text_index = header.text_index if as_read else None
        starts = header_starts(header)  # a record starting so may be the header again
        add_id, add_hash, add_size = planner.ids.append, planner.hashes.append, planner.sizes.append
        add_line, add_last_line = planner.lines.append, planner.last_lines.append
        # The one per-record loop: all that planning does per row happens here, in order.
        # Calls and copies per row are avoided where a test answers (a million rows: each
        # costs about 0.1 s): row_id_of only words the error of an id that fails its rule.
        for line, last_line, fields in records:
            if fields[0] in starts:
                refuse_repeated_header(fields, line, header, source_path)
            if len(fields) != width:
                check_width(fields, line, header, source_path)
            row_id = fields[id_index]
            if not row_id or row_id.isspace() or "\x1f" in row_id:
                row_id = row_id_of(fields, line, header, source_path)
            text = fields[text_index] if text_index is not None else text_of(fields)
            raw = text.encode("utf-8")
            add_id(row_id)
            add_hash(sha256(raw).hexdigest())  # keys.text_sha256, with the bytes kept
            add_size(len(raw))
            add_line(line)
            add_last_line(last_line)
            if text and not text.isspace():  # the rule of tasks.embed.rows (text.strip())
                any_text = True
            else:
                planner.empties.append(filled)
            if keeping:
                # kept_hash is str whenever columns are kept
                planner.kept.append(kept_hash(fields))  # type: ignore[arg-type]
            filled += 1
            if filled == chunk_size:
                planner.full(last_line)
                filled = 0
        size = lines.offset
        planner.close(stop=size)  # trailing blank lines belong to the last chunk
    facts.finish()
    raise_on_duplicates(facts.suspects(), found, fmt, header)
    if not facts.count:
        raise InputError(
            "the file has a header and no data rows: nothing to embed. An empty export "
            "committed as a run would read as 'every row removed' (and a sink load would "
            "delete every row); check the export, or skip this run",
            path=source_path,
            line=header_line + 1,
        )
    if not any_text:
        column = header.names[header.text_index]
        where = (
            f"composed by --text-template from {', '.join(map(repr, template.columns))}"
            if template
            else f"in column {column!r}"
        )
        raise InputError(
            f"every text {where} is empty or whitespace ({facts.count:,} rows): "
            "nothing to embed. Committed, it would read as 'every row removed' (and a sink load "
            "would delete every row); check the export and "
            f"{'--text-template' if template else '--text-column'}",
            path=source_path,
            line=header_line + 1,
            column=column,
        )
    source = InputSource(
        path=found.uri,
        name=found.name,
        version=getattr(found, "etag", None),
        encoding=fmt.codec,
        newline=fmt.newline,
        delimiter=fmt.delimiter,
        quoting=fmt.quoting,
        note=fmt.note,
        id_column=id_column,
        text_column=text_column,
        id_index=header.id_index,
        text_index=header.text_index,
        n_fields=len(header.names),
        data_start=data_start,
        **shape.source_fields(text_template, keep_text),
    )
    return InputPlan(
        source=source,
        sha256=hashes.file.hexdigest(),
        bytes=size,
        rows=facts.count,
        chunks=tuple(planner.chunks),
        scratch=str(scratch.path) if scratch is not None else None,
    )


def _add_batches(
    lines: RecordBlocks,
    planner: _Planner,
    header: Header,
    data_start: int,
    delimiter: str,
    source_path: str,
    truncate_bytes: int | None,
) -> Iterator[tuple[int, int, list[str]]]:
    """Plan the data records Arrow reads alike (``adapters.csv_batches``); the records
    (``read_records``) from where it stops."""
    lines.split_at(data_start)
    shape = RecordShape(
        width=len(header.names),
        id_index=header.id_index,
        text_index=header.text_index,
        delimiter=delimiter,
        starts=header_starts(header),
        truncate_bytes=truncate_bytes,
    )
    for batch in lines.batches(shape):
        planner.add_batch(batch)
    return read_records(lines, source_path, delimiter, "minimal")


class _Shape:
    """How a record becomes a text and kept values, by the header's positions."""

    def __init__(
        self,
        header: Header,
        template: Template | None,
        keep_columns: Sequence[str],
        normalize: Literal["none", "NFC", "NFKC"] = "none",
        truncate_bytes: int | None = None,
    ) -> None:
        self.parts = (
            tuple(
                (literal, header.columns[c] if c is not None else -1)
                for literal, c in template.parts
            )
            if template
            else ()
        )
        self.text_index = header.text_index
        self.keep_columns = tuple(keep_columns)
        self.kept_indexes = tuple(header.columns[c] for c in keep_columns)
        self.normalize = normalize
        self.truncate_bytes = truncate_bytes

    def text_of(self, fields: list[str]) -> str:
        """The record's text, as ``InputSource.text_of`` composes it (``compose_text``)."""
        return compose_text(
            fields, self.parts, self.text_index, self.normalize, self.truncate_bytes
        )

    def kept_hash(self, fields: list[str]) -> str | None:
        if not self.kept_indexes:
            return None
        return kept_sha256([fields[i] for i in self.kept_indexes])

    def source_fields(self, text_template: str | None, keep_text: bool) -> dict[str, Any]:
        return {
            "text_parts": self.parts,
            "kept_columns": self.keep_columns,
            "kept_indexes": self.kept_indexes,
            "keep_text": keep_text,
            "text_template": text_template,
            "normalize": self.normalize,
            "truncate_bytes": self.truncate_bytes,
        }
