"""``embedline run``'s options: built from the table generated from ``RunSettings``
(``cli/run_options_table.py``), and ``--help`` answers without importing pydantic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("command", [[], ["run"], ["deployment"], ["retry-failed"], ["status"]])
def test_help_imports_neither_pydantic_nor_the_data_libraries(command: list[str]) -> None:
    """``--help`` reads the options' table only: pydantic (about 0.25 s), numpy and pyarrow
    are imported by the commands that use them, not by the parser."""
    code = (
        "import contextlib, io, sys\n"
        "from cli.main import _parser\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        f"    _parser().parse_args({[*command, '--help']!r})\n"
        "assert 'usage: embedline' in out.getvalue(), out.getvalue()\n"
        "heavy = ('pydantic', 'numpy', 'pyarrow', 'prefect')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
