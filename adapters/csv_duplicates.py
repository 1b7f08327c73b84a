"""Duplicate ids in a CSV input, confirmed and named: planning keeps only 64-bit digests of
the ids, so a digest seen twice sends a second pass here to find the real duplicates and
their lines."""

from __future__ import annotations

from typing import Any

from adapters.csv_format import CsvFormat
from adapters.csv_records import Header, open_lines, read_header, read_records
from adapters.row_facts import id_digests
from embedline.errors import InputError

__all__ = ["raise_on_duplicates"]

_MAX_DUPLICATES_REPORTED = 5


def raise_on_duplicates(suspects: set[int], found: Any, fmt: CsvFormat, header: Header) -> None:
    """Raise InputError listing the first duplicated ids with their lines, if any.

    The pass kept only 64-bit digests (``RowFacts.suspects``: those seen twice); a second
    pass runs only when digests repeat, and it confirms real duplicates (a digest collision
    of distinct ids is not reported).
    """
    if not suspects:
        return
    path = found.uri
    lines_by_id: dict[str, list[int]] = {}
    with found.open() as fh:
        records = read_records(open_lines(fh, path, fmt), path, fmt.delimiter, fmt.quoting)
        read_header(records, fmt, path)
        for line, _, fields in records:
            row_id = fields[header.id_index]
            if int(id_digests([row_id])[0]) in suspects:
                lines_by_id.setdefault(row_id, []).append(line)
    duplicates = [(i, ls) for i, ls in lines_by_id.items() if len(ls) > 1]
    if not duplicates:
        return
    shown = "; ".join(
        f"{row_id!r} at lines {', '.join(map(str, ls[:5]))}"
        for row_id, ls in duplicates[:_MAX_DUPLICATES_REPORTED]
    )
    more = len(duplicates) - _MAX_DUPLICATES_REPORTED
    column = header.names[header.id_index]
    raise InputError(
        f"{len(duplicates)} duplicated id(s) in column {column!r}: {shown}"
        + (f"; and {more} more" if more > 0 else "")
        + ". Ids must be unique: remove or rename the duplicates",
        path=path,
        line=duplicates[0][1][1],
        column=column,
    )
