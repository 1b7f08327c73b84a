"""Generate the ``embedline run`` option table of ``docs/reference/cli.md`` from the parser.

The table sits between the lines ``<!-- BEGIN GENERATED: embedline run --help -->`` and
``<!-- END GENERATED -->``; everything else in the page is written by hand. The table is
built from the same argparse parser ``embedline run --help`` prints (``cli.main``), with
each option's help expanded as the help formatter expands it (defaults included), so the
page and ``--help`` cannot drift apart. No Prefect server is needed: building the parser
imports no Prefect.

Usage, from the repository root::

    python docs/gen_cli_reference.py          # rewrite the table in docs/reference/cli.md
    python docs/gen_cli_reference.py --check  # exit 1, with a one-line hint, if it differs

``render()`` and ``check()`` are for tests (``tests/unit/test_cli_reference.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI_MD = ROOT / "docs" / "reference" / "cli.md"
BEGIN = "<!-- BEGIN GENERATED: embedline run --help -->"
END = "<!-- END GENERATED -->"

__all__ = ["BEGIN", "CLI_MD", "END", "check", "main", "render", "rewrite", "run_parser"]


def run_parser() -> argparse.ArgumentParser:
    """The parser of ``embedline run``, as the console script builds it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from cli.main import _parser

    top = _parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["run"]
    raise LookupError("the embedline parser has no 'run' command")


def _cell(text: str) -> str:
    """``text`` on one line, safe inside a Markdown table cell."""
    text = " ".join(text.split())
    for raw, escaped in (("\\", "\\\\"), ("|", "\\|"), ("*", "\\*"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(raw, escaped)
    return text


def _code(text: str) -> str:
    """``text`` as a code span inside a table cell (a ``|`` still needs its backslash)."""
    return f"`{text.replace('|', chr(92) + '|')}`" if text else ""


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The Markdown table of ``parser``'s arguments (default: ``embedline run``'s), one row
    per argument in ``--help`` order: option, argument, help with its default."""
    parser = parser or run_parser()
    formatter = parser._get_formatter()
    rows = ["| option | argument | help |", "| --- | --- | --- |"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            option = ", ".join(action.option_strings)
            default = formatter._get_default_metavar_for_optional(action)
            argument = formatter._format_args(action, default) if action.nargs != 0 else ""
        else:
            option = formatter._format_args(
                action, formatter._get_default_metavar_for_positional(action)
            )
            argument = ""
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {_code(option)} | {_code(argument)} | {_cell(help_text)} |")
    return "\n".join(rows) + "\n"


def rewrite(text: str, block: str) -> str:
    """``text`` with the lines between BEGIN and END replaced by ``block``.

    :raises ValueError: if ``text`` lacks either marker line, or has END before BEGIN.
    """
    lines = text.splitlines(keepends=True)
    stripped = [line.strip() for line in lines]
    try:
        start = stripped.index(BEGIN)
        stop = stripped.index(END, start + 1)
    except ValueError:
        raise ValueError(f"the page needs the lines {BEGIN!r} and then {END!r}") from None
    return "".join(lines[: start + 1]) + block + "".join(lines[stop:])


def check(path: Path = CLI_MD, parser: argparse.ArgumentParser | None = None) -> bool:
    """True when the table in ``path`` equals ``render(parser)``."""
    text = path.read_text(encoding="utf-8")
    return rewrite(text, render(parser)) == text


def _first_difference(old: str, new: str) -> str:
    """A one-line hint: the first line that differs, as it is and as it would be."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for number, (was, will) in enumerate(zip(old_lines, new_lines, strict=False), start=1):
        if was != will:
            return f"line {number}: {was[:60]!r} should be {will[:60]!r}"
    number = min(len(old_lines), len(new_lines)) + 1
    return f"line {number}: the page has {len(old_lines)} lines, the table needs {len(new_lines)}"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the table (exit 0), or with ``--check`` exit 1 when it is out of date."""
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 if the table differs from --help",
    )
    options = args.parse_args(argv)
    text = CLI_MD.read_text(encoding="utf-8")
    new = rewrite(text, render())
    shown = CLI_MD.relative_to(ROOT)
    if options.check:
        if new != text:
            print(
                f"{shown}: the `embedline run` table differs from `embedline run --help` "
                f"({_first_difference(text, new)}); run python docs/gen_cli_reference.py"
            )
            return 1
        return 0
    if new != text:
        CLI_MD.write_text(new, encoding="utf-8")
        print(f"{shown}: `embedline run` table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
