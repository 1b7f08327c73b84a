"""Reading one chunk of a planned CSV input: seek to its byte range, check the bytes against
the plan's SHA-256, parse its records into ``Row``s. A chunk never reads another's bytes; a
delta chunk reads the span of the planned chunks it takes rows from. Records are split as
planning split them (``InputSource.quoting``) and texts composed and normalized alike
(``InputSource.text_of``)."""

from __future__ import annotations

import hashlib
import io
from dataclasses import replace

from adapters.csv_format import CsvFormat
from adapters.csv_lines import NeedsLineReader
from adapters.csv_records import open_lines, read_records
from adapters.input_source import open_input
from embedline.errors import InputError
from embedline.keys import text_sha256
from embedline.models import ChunkSpec, InputSource, Row

__all__ = ["read_chunk"]


def read_chunk(source: InputSource, spec: ChunkSpec) -> list[Row]:
    """Read the ``spec.rows`` records of one chunk by seeking to its byte range (a delta
    chunk: those it takes from its parts, ``ChunkSpec.parts``).

    Returns ``Row``s in input order. The bytes are checked against the plan's SHA-256 first,
    so a file edited after planning is refused rather than published under the old keys.

    :raises InputError: (exit 2) the input changed since planning, or cannot be read.
    """
    data = open_input(source.path, etag=source.version).read_range(spec.byte_start, spec.byte_stop)
    if spec.parts:
        return _delta_rows(source, spec, data)
    return _planned_rows(source, spec, data)


def _delta_rows(source: InputSource, spec: ChunkSpec, data: bytes) -> list[Row]:
    """The rows of a delta chunk (``spec.parts``) from ``data``, the bytes of its span: each
    part's bytes checked and parsed as its planned chunk, then the positions it takes."""
    rows: list[Row] = []
    for part in spec.parts:
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
        read = _planned_rows(
            source,
            planned,
            data[part.byte_start - spec.byte_start : part.byte_stop - spec.byte_start],
        )
        rows.extend(read[p] for p in part.positions)
    if len(rows) != spec.rows:
        raise InputError(
            f"chunk {spec.index} holds {len(rows)} records, the plan said {spec.rows}",
            path=source.path,
            line=spec.line_start,
        )
    return rows


def _planned_rows(source: InputSource, spec: ChunkSpec, data: bytes) -> list[Row]:
    """The ``spec.rows`` records of a planned chunk whose bytes are ``data``, checked against
    the plan's SHA-256."""
    if hashlib.sha256(data).hexdigest() != spec.bytes_sha256:
        raise InputError(
            f"the input changed while the run read it (chunk {spec.index}, bytes "
            f"{spec.byte_start}-{spec.byte_stop}); rerun once the file is no longer being written",
            path=source.path,
            line=spec.line_start,
        )
    try:
        rows = _chunk_rows(source, spec, data, fast=True)
    except NeedsLineReader:  # undecodable bytes: the line reader names the line
        rows = _chunk_rows(source, spec, data, fast=False)
    if len(rows) != spec.rows:
        raise InputError(
            f"chunk {spec.index} holds {len(rows)} records, the plan said {spec.rows}",
            path=source.path,
            line=spec.line_start,
        )
    return rows


def _chunk_rows(source: InputSource, spec: ChunkSpec, data: bytes, *, fast: bool) -> list[Row]:
    """The ``Row``s of the chunk ``spec`` whose bytes are ``data``.

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
    rows = []
    for number, (line, _, fields) in enumerate(
        read_records(lines, source.path, source.delimiter, source.quoting), start=spec.first_row
    ):
        text = text_of(fields)
        kept = kept_of(fields) if keeps else ()
        rows.append(Row(number, line, fields[id_index], text, text_sha256(text), kept))
    return rows
