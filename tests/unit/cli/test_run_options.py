"""``embedline run``'s options: built from the table generated from ``RunSettings``
(``cli/run_options_table.py``), and ``--help`` answers without importing pydantic."""

from __future__ import annotations

import subprocess
import sys
import typing
from argparse import SUPPRESS
from pathlib import Path

import pytest

from cli import arguments
from cli import gen_run_options as gen
from cli.run_options_table import RUN_OPTIONS
from embedline.settings import BATCH_API_OPTIONS, MODE_OPTIONS, PARAMETER_FIELDS, RunSettings

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


def test_the_table_is_generated_from_run_fields() -> None:
    assert gen.check(), "cli/run_options_table.py is stale: run python -m cli.gen_run_options"
    assert gen.main(["--check"]) == 0


def test_a_hand_edited_table_makes_the_check_fail(tmp_path: Path) -> None:
    table = tmp_path / "run_options_table.py"
    table.write_text(
        gen.table_path().read_text(encoding="utf-8").replace("default=1000,", "default=100,"),
        encoding="utf-8",
    )
    assert not gen.check(table)


def test_each_field_is_an_option_by_the_rules() -> None:
    options = {option.dest: option for option in RUN_OPTIONS}
    assert [option.dest for option in RUN_OPTIONS] == [
        next((k for k, v in PARAMETER_FIELDS.items() if v == field), field)
        for field in RunSettings.model_fields
    ]
    assert options["input"].flags == () and options["input"].metavar == "INPUT"
    assert options["timeout"].flags == ("--timeout",)  # RunSettings.timeout_s
    assert options["reuse"][1:5] == (
        ("--no-reuse",),
        options["reuse"].help,
        "store_false",
        SUPPRESS,
    )
    assert options["keep_text"][3:5] == ("store_true", False)
    assert options["quoting"].choices == ("minimal", "none")
    types = {name: option.type for name, option in options.items() if option.type}
    assert types["chunk_size"] == "positive_int"
    assert types["chunk_retries"] == "non_negative_int"
    assert types["timeout"] == "positive_float"
    assert types["grace"] == "non_negative_float"
    assert types["max_delete_fraction"] == "fraction"
    assert types["text_template"] == "template_text"  # Cli(type=...)
    assert "keep_columns" not in types and "output" not in types
    assert "25%% rows" in options["compact"].help  # argparse's %-formatting


def test_options_of_one_mode_are_unset_unless_given_and_say_their_default() -> None:
    options = {option.dest: option for option in RUN_OPTIONS}
    assert set(BATCH_API_OPTIONS) < set(MODE_OPTIONS)
    for name in MODE_OPTIONS:
        assert options[name].default is SUPPRESS, name
        default = RunSettings.model_fields[PARAMETER_FIELDS.get(name, name)].default
        if default is not None:
            assert options[name].help.endswith(f" (default: {default})"), name


def test_each_argparse_type_gives_the_field_s_type() -> None:
    """``--chunk-size 2.5`` must fail in the CLI exactly when the settings' ``int`` would:
    a type named by ``Cli(type=...)`` is not checked by the rules."""
    for option in RUN_OPTIONS:
        if option.type is None:
            continue
        field = RunSettings.model_fields[PARAMETER_FIELDS.get(option.dest, option.dest)]
        kind = typing.get_args(field.annotation) or (field.annotation,)
        kinds = {typing.get_origin(k) or k for k in kind}  # dict[str, Any]: dict
        value = getattr(arguments, option.type)("{}" if option.type == "json_object" else "1")
        assert type(value) in kinds, f"--{option.dest}: {option.type} gives {type(value)}"


def test_a_field_the_rules_cannot_place_needs_a_cli_type() -> None:
    with pytest.raises(ValueError, match=r"name one with Cli\(type=\.\.\.\)"):
        gen._type_for("ratio", float, [])
    with pytest.raises(ValueError, match="no argparse type"):
        gen._type_for("count", int, [])
