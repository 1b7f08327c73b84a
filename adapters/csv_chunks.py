"""Reading one chunk of a planned CSV input: seek to its byte range, check the bytes against
the plan's SHA-256, parse its records into ``Row``s. A chunk never reads another's bytes; a
delta chunk reads the planned chunks it takes rows from, a span of at most 16 MiB at a time,
and parses only the records it takes, from the lines planning saw them on. Records are split as
planning split them (``InputSource.quoting``) and texts composed and normalized alike
(``InputSource.text_of``)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from adapters.csv_format import CsvFormat
from adapters.csv_lines import NeedsLineReader, block_decodable
from adapters.csv_records import open_lines, read_records
from adapters.input_source import InputFile, open_input
from embedline.errors import InputError
from embedline.keys import rows_sha256, text_sha256
from embedline.models import ChunkPart, ChunkSpec, InputSource, Row
from embedline.template import kept_sha256

__all__ = ["read_chunk"]


def read_chunk(source: InputSource, spec: ChunkSpec) -> list[Row]:
    """Read the ``spec.rows`` records of one chunk by seeking to its byte range (a delta
    chunk: those it takes from its parts, ``ChunkSpec.parts``).

    Returns ``Row``s in input order. The bytes are checked against the plan's SHA-256 first,
    so a file edited after planning is refused rather than published under the old keys.

    :raises InputError: (exit 2) the input changed since planning, or cannot be read.
    """
    opened = open_input(source.path, etag=source.version)
    if spec.parts:
        return _delta_rows(source, spec, opened)
    return _planned_rows(source, spec, opened.read_range(spec.byte_start, spec.byte_stop))


#: A delta chunk reads the planned chunks it takes rows from a span of at most this many bytes
#: at a time (or one planned chunk, when longer): its rows may be scattered through the whole
#: input, whose bytes must never be held at once.
_SPAN_BYTES = 16 << 20


def _delta_rows(source: InputSource, spec: ChunkSpec, opened: InputFile) -> list[Row]:
    """The rows of a delta chunk (``spec.parts``): the parts' bytes read a span at a time
    (``_SPAN_BYTES``), then only the records it takes parsed (``_planned_rows`` with the part).

    What is checked against planning: with ``spec.rows_sha256`` and lines known (an input
    ``block_decodable`` reads lines so), the rows parsed (ids, text hashes, kept values), as
    a whole, by ``keys.rows_sha256``; no other row's bytes are hashed. Else each part's bytes,
    as its planned chunk's (``bytes_sha256``)."""
    by_rows = bool(spec.rows_sha256) and block_decodable(source.encoding, source.newline)
    rows: list[Row] = []
    for span in _spans(spec.parts):
        data = opened.read_range(span[0].byte_start, span[-1].byte_stop)
        for part in span:
            planned = replace(
                spec,
                first_row=part.first_row,
                line_start=part.line_start,
                rows=part.rows,
                byte_start=part.byte_start,
                byte_stop=part.byte_stop,
                bytes_sha256=part.bytes_sha256,
                parts=(),
            )
            start = part.byte_start - span[0].byte_start
            part_bytes = data[start : start + part.byte_stop - part.byte_start]
            if by_rows and part.lines:
                rows.extend(_rows_on_lines(source, planned, part_bytes, part))
            else:
                rows.extend(_planned_rows(source, planned, part_bytes, part=part))
    if len(rows) != spec.rows:
        raise InputError(
            f"chunk {spec.index} holds {len(rows)} records, the plan said {spec.rows}",
            path=source.path,
            line=spec.line_start,
        )
    if spec.rows_sha256 and _rows_sha256(source, rows) != spec.rows_sha256:
        raise InputError(
            f"the input changed while the run read it (chunk {spec.index}: its records are not "
            "the ones planned); rerun once the file is no longer being written",
            path=source.path,
            line=spec.line_start,
        )
    return rows


def _rows_sha256(source: InputSource, rows: Sequence[Row]) -> str:
    """``keys.rows_sha256`` of ``rows`` as planning hashed them (kept values by
    ``template.kept_sha256``)."""
    kept = [kept_sha256(r.kept) for r in rows] if source.kept_indexes else None
    return rows_sha256([r.id for r in rows], [r.text_sha256 for r in rows], kept)


def _spans(parts: Sequence[ChunkPart]) -> Iterator[list[ChunkPart]]:
    """``parts`` (in input order) in runs read at once: each run's bytes, from its first
    part's start to its last's stop, at most ``_SPAN_BYTES`` (or a single part)."""
    span: list[ChunkPart] = []
    for part in parts:
        if span and part.byte_stop - span[0].byte_start > _SPAN_BYTES:
            yield span
            span = []
        span.append(part)
    if span:
        yield span


def _planned_rows(
    source: InputSource, spec: ChunkSpec, data: bytes, part: ChunkPart | None = None
) -> list[Row]:
    """The ``spec.rows`` records of a planned chunk whose bytes are ``data``, checked against
    the plan's SHA-256; with ``part``, only the rows at its positions (the bytes' SHA-256
    already says they are the planned ones): each parsed alone from the lines planning saw
    it on (``_rows_on_lines``), or the chunk parsed no further than the last."""
    if hashlib.sha256(data).hexdigest() != spec.bytes_sha256:
        raise InputError(
            f"the input changed while the run read it (chunk {spec.index}, bytes "
            f"{spec.byte_start}-{spec.byte_stop}); rerun once the file is no longer being written",
            path=source.path,
            line=spec.line_start,
        )
    if part is not None and part.lines and block_decodable(source.encoding, source.newline):
        return _rows_on_lines(source, spec, data, part)
    positions = part.positions if part is not None else None
    try:
        rows = _chunk_rows(source, spec, data, fast=True, positions=positions)
    except NeedsLineReader:  # undecodable bytes: the line reader names the line
        rows = _chunk_rows(source, spec, data, fast=False, positions=positions)
    wanted = spec.rows if positions is None else len(positions)
    if len(rows) != wanted:
        raise InputError(
            f"chunk {spec.index} holds {len(rows)} records, the plan said {spec.rows}",
            path=source.path,
            line=spec.line_start,
        )
    return rows


def _rows_on_lines(source: InputSource, spec: ChunkSpec, data: bytes, part: ChunkPart) -> list[Row]:
    """The rows at ``part``'s positions of the planned chunk ``spec`` (bytes ``data``), each
    parsed from its own lines (``part.lines`` to ``part.last_lines``, found by counting
    ``\n`` bytes: an input ``block_decodable`` reads lines so)."""
    ends = _line_ends(data, part.last_lines[-1] - spec.line_start + 1 if part.last_lines else 0)
    rows: list[Row] = []
    for position, line, last_line in zip(part.positions, part.lines, part.last_lines, strict=True):
        first, last = line - spec.line_start, last_line - spec.line_start
        start = int(ends[first - 1]) + 1 if first > 0 else 0
        stop = int(ends[last]) + 1 if last < len(ends) else len(data)
        record = replace(
            spec,
            first_row=spec.first_row + position,
            line_start=line,
            byte_start=spec.byte_start + start,
        )
        try:
            read = _chunk_rows(source, record, data[start:stop], fast=True)
        except NeedsLineReader:
            read = _chunk_rows(source, record, data[start:stop], fast=False)
        if len(read) != 1:
            raise InputError(
                f"chunk {spec.index}: lines {line}-{last_line} hold {len(read)} records, "
                "planning read one",
                path=source.path,
                line=line,
            )
        rows.append(read[0])
    return rows


def _line_ends(data: bytes, lines: int) -> np.ndarray:
    """Offsets of the first ``lines`` ``\\n`` bytes of ``data`` (fewer if it has fewer),
    found a 256 KiB window at a time: a part's last taken record is often far from its end."""
    found: list[np.ndarray] = []
    held, start = 0, 0
    while held < lines and start < len(data):
        window = np.frombuffer(
            data, dtype=np.uint8, count=min(_WINDOW, len(data) - start), offset=start
        )
        ends = np.flatnonzero(window == 0x0A) + start
        found.append(ends)
        held += len(ends)
        start += _WINDOW
    return np.concatenate(found)[:lines] if found else np.zeros(0, dtype=np.int64)


_WINDOW = 1 << 18


def _chunk_rows(
    source: InputSource,
    spec: ChunkSpec,
    data: bytes,
    *,
    fast: bool,
    positions: Sequence[int] | None = None,
) -> list[Row]:
    """The ``Row``s of the chunk ``spec`` whose bytes are ``data`` (with ``positions``:
    those at the positions, the records after the last one not parsed).

    :raises NeedsLineReader: ``fast`` met bytes it cannot decode.
    """
    fmt = CsvFormat(source.encoding, source.newline, source.delimiter, quoting=source.quoting)
    lines = open_lines(
        io.BytesIO(data),
        source.path,
        fmt,
        fast=fast,
        line=spec.line_start - 1,
        offset=spec.byte_start,
    )
    text_of, kept_of, id_index = source.text_of, source.kept_of, source.id_index
    keeps = bool(source.kept_indexes)
    records = read_records(lines, source.path, source.delimiter, source.quoting)
    taken = enumerate(records) if positions is None else _at(records, positions)
    rows = []
    for position, (line, _, fields) in taken:
        text = text_of(fields)
        kept = kept_of(fields) if keeps else ()
        number = spec.first_row + position
        rows.append(Row(number, line, fields[id_index], text, text_sha256(text), kept))
    return rows


def _at(
    records: Iterator[tuple[int, int, list[str]]], positions: Sequence[int]
) -> Iterator[tuple[int, tuple[int, int, list[str]]]]:
    """``(position, record)`` of the ``records`` at ``positions`` (ascending); the records
    after the last position are not read."""
    wanted = iter(positions)
    position = next(wanted, None)
    if position is None:
        return
    for at, record in enumerate(records):
        if at == position:
            yield at, record
            position = next(wanted, None)
            if position is None:
                return
