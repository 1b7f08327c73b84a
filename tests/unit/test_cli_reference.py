"""The ``embedline run`` option table of ``docs/reference/cli.md`` equals ``embedline run
--help``: ``docs/gen_cli_reference.py`` generates it, and these tests fail when it is stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_cli_reference", REPO / "docs" / "gen_cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_equals_run_help(gen: ModuleType) -> None:
    assert gen.check(), "docs/reference/cli.md is stale: run python docs/gen_cli_reference.py"


def test_every_run_option_is_in_the_table(gen: ModuleType) -> None:
    table = gen.render()
    for action in gen.run_parser()._actions:
        for option in action.option_strings:
            assert option in table


def test_an_added_option_makes_the_check_fail(gen: ModuleType) -> None:
    parser = gen.run_parser()
    parser.add_argument("--brand-new", metavar="N", help="an option nobody documented")
    assert "`--brand-new` | `N` | an option nobody documented" in gen.render(parser)
    assert not gen.check(parser=parser)


def test_a_hand_edited_table_makes_the_check_fail(gen: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "cli.md"
    page.write_text(
        gen.CLI_MD.read_text(encoding="utf-8").replace("| `--chunk-size` |", "| `--chunk-sise` |"),
        encoding="utf-8",
    )
    assert not gen.check(page)
    page.write_text(gen.rewrite(page.read_text(encoding="utf-8"), gen.render()), encoding="utf-8")
    assert gen.check(page)


def test_pipes_are_escaped_in_cells(gen: ModuleType) -> None:
    for line in gen.render().splitlines():
        cells = line.replace("\\|", "").split("|")
        assert len(cells) == 5, line


def test_rewrite_needs_both_markers(gen: ModuleType) -> None:
    with pytest.raises(ValueError):
        gen.rewrite("no markers here\n", "| table |\n")
