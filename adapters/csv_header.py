"""The header of a CSV input, checked on its own before a run starts, and the text template
that names columns in it: each answers in milliseconds, before anything is planned."""

from __future__ import annotations

import os
from collections.abc import Sequence

from adapters.csv_format import CsvFormat, sniff_stream
from adapters.csv_records import open_lines, parse_header, read_header, read_records
from adapters.input_source import open_input
from embedline.errors import InputError
from embedline.template import Template, TemplateError, parse_template

__all__ = ["check_header", "template_of"]


def check_header(
    path: str | os.PathLike[str],
    *,
    id_column: str,
    text_column: str,
    codec: str,
    delimiter: str = ",",
    text_template: str | None = None,
    keep_columns: Sequence[str] = (),
    quoting: str = "minimal",
) -> CsvFormat:
    """Read only the header (and any BOM, and Excel's ``sep=X`` line) of ``path``: a fast
    check before anything starts. Returns the format ``sniff_format`` chose (its ``note``
    says what was detected); ``quoting`` as ``plan_csv``.

    :raises InputError: unreadable or binary file, undecodable header, missing or duplicated
        id/text column, a template or kept column missing, a malformed template, empty file.
    """
    template = template_of(text_template)
    found = open_input(os.fspath(path))
    with found.open() as fh:
        fmt = sniff_stream(
            fh,
            found.uri,
            codec,
            delimiter,
            id_column,
            template.columns[0] if template else text_column,
            quoting,
        )
        lines = open_lines(fh, found.uri, fmt, fast=False)  # the header's lines alone
        records = read_records(lines, found.uri, fmt.delimiter, fmt.quoting)
        line, _, fields = read_header(records, fmt, found.uri)
    parse_header(
        fields,
        id_column=id_column,
        text_column=text_column,
        path=found.uri,
        template_columns=template.columns if template else (),
        keep_columns=keep_columns,
        line=line,
    )
    return fmt


def template_of(text_template: str | None) -> Template | None:
    """The parsed template (None: the plain text column).

    :raises InputError: the template is malformed (exit 2).
    """
    if text_template is None:
        return None
    try:
        return parse_template(text_template)
    except TemplateError as exc:
        raise InputError(f"--text-template: {exc}") from None
