"""Text templates and kept columns: how a row's text is built, and what is kept beside it.

A template is text with ``{column}`` placeholders (``{{`` and ``}}`` are literal braces),
e.g. ``"{title}\\n\\n{text}"``; ``--text-column X`` is the template ``{X}``. The composed
string is "the text" everywhere (docs/reference/keys.md): its ``text_sha256``, the row key, reuse,
dedup, change sets, token estimates and the empty-text rule. Kept columns (``--keep-columns``) are
carried, as the exact strings read, into chunk objects, readers and sinks
(docs/reference/output-layout.md, docs/reference/sinks.md).

Pure: no I/O. Parsing is our own, not ``str.format`` (which would read ``{a.b}``, ``{a[0]}``
and ``{a:>9}`` as attribute, index and format spec: a column name may hold any of those).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "RESERVED_COLUMNS",
    "TEXT_COLUMN",
    "Template",
    "TemplateError",
    "kept_sha256",
    "parse_template",
    "placeholder",
    "unescape_cli",
]

#: Columns every chunk object (and sink) has: a kept column may not take their names.
#: ``run_key`` and ``kept_sha256`` are the sinks' own (docs/reference/sinks.md).
RESERVED_COLUMNS = ("id", "embedding", "text_sha256", "idempotency_key", "run_key", "kept_sha256")
#: The column ``--keep-text`` adds: the composed text.
TEXT_COLUMN = "text"


class TemplateError(ValueError):
    """Raised when a template is malformed (an unclosed ``{``, a lone ``}``, ``{}``)."""


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: ``parts`` alternate literal text and column names.

    Each part is ``(literal, column)``: the literal text, then the column whose value
    follows it (``None`` for a trailing literal). ``source`` is the template as written.
    """

    source: str
    parts: tuple[tuple[str, str | None], ...]

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the template names, in order of first use, each once."""
        seen: dict[str, None] = {}
        for _, column in self.parts:
            if column is not None:
                seen.setdefault(column, None)
        return tuple(seen)

    @property
    def single_column(self) -> str | None:
        """The column of a template that is exactly one placeholder (``{X}``), else None."""
        if len(self.parts) == 1 and self.parts[0][0] == "" and self.parts[0][1] is not None:
            return self.parts[0][1]
        return None

    def compose(self, values: dict[str, str]) -> str:
        """The text for one row; ``values`` maps every column of the template to its field.

        :raises KeyError: a column of the template is missing from ``values``.
        """
        return "".join(
            literal + (values[column] if column is not None else "")
            for literal, column in self.parts
        )


def placeholder(column: str) -> str:
    """The template ``{column}`` that stands for the plain text column ``column`` (what a
    manifest records for a run without ``--text-template``)."""
    return "{" + column + "}"


def parse_template(source: str) -> Template:
    """Parse ``source``: ``{name}`` is the field of column ``name``; ``{{``/``}}`` are
    literal braces. A name is every character up to the next ``}``, as in ``str.format``
    (so ``{{{title}}}`` is the title in braces); a name cannot hold a brace.

    :raises TemplateError: an unclosed ``{``, a ``}`` that is not doubled, an empty ``{}``,
        or no placeholder at all (every row would have the same text).
    """
    parts: list[tuple[str, str | None]] = []
    literal: list[str] = []
    i, n = 0, len(source)
    while i < n:
        char = source[i]
        if char == "{" and source.startswith("{{", i):
            literal.append("{")
            i += 2
        elif char == "{":
            name, i = _name(source, i + 1)
            parts.append(("".join(literal), name))
            literal = []
        elif char == "}":
            if not source.startswith("}}", i):
                raise TemplateError(
                    f"a single '}}' at character {i + 1} of the template; "
                    f"write '}}}}' for a literal brace"
                )
            literal.append("}")
            i += 2
        else:
            literal.append(char)
            i += 1
    if literal:
        parts.append(("".join(literal), None))
    template = Template(source, tuple(parts))
    if not template.columns:
        raise TemplateError(
            "the template names no column: write {column} where a column's "
            "value goes (e.g. '{title}\\n\\n{text}')"
        )
    return template


def _name(source: str, start: int) -> tuple[str, int]:
    """The column name after a ``{`` at ``start - 1``, and the index after its ``}``."""
    name: list[str] = []
    i = start
    while i < len(source):
        if source[i] == "}":
            if not name:
                raise TemplateError(
                    f"an empty '{{}}' at character {start} of the template: "
                    "name a column inside the braces"
                )
            return "".join(name), i + 1
        elif source[i] == "{":
            raise TemplateError(
                f"a '{{' inside the placeholder at character {start} of the "
                f"template; write '{{{{' outside placeholders for a literal "
                "brace"
            )
        else:
            name.append(source[i])
            i += 1
    raise TemplateError(
        f"the '{{' at character {start} of the template is never closed; "
        "write '{{' for a literal brace"
    )


_CLI_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape_cli(text: str) -> str:
    """``\\n`` → newline, ``\\t`` → tab, ``\\\\`` → backslash, as a shell cannot type them
    in single quotes; any other backslash stays as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _CLI_ESCAPES:
            out.append(_CLI_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def kept_sha256(values: Sequence[str | None]) -> str:
    """The hex SHA-256 of a row's kept values as a JSON array (UTF-8, no ASCII escaping,
    separators ``,`` and ``:`` without spaces): the part of the chunk key and of a sink's
    held key that a metadata-only edit changes (docs/reference/keys.md, docs/reference/sinks.md)."""
    body = json.dumps(list(values), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(body.encode("utf-8")).hexdigest()
