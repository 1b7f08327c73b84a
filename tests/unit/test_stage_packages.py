"""The stages under ``tasks/`` are packages, Prefect-free but for one thin wrapper module each
(``task.py``, which holds the stage's ``@task``), and they never import ``flows``: imports go
flows → tasks → adapters → embedline. Imports inside functions count as well."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tasks"
WRAPPER = "task.py"  # the one module of a stage package that may import Prefect
STAGES = sorted(p.parent.name for p in TASKS.glob("*/__init__.py"))


def _imported(path: Path) -> set[str]:
    """Top-level names of what ``path`` imports, module- and function-level, absolute."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_every_stage_module_lives_in_a_stage_package() -> None:
    flat = sorted(p.name for p in TASKS.glob("*.py") if p.name != "__init__.py")
    assert STAGES, "no stage packages under tasks/"
    assert not flat, f"modules directly under tasks/, outside any stage package: {flat}"


@pytest.mark.parametrize("stage", STAGES)
def test_only_the_wrapper_module_imports_prefect(stage: str) -> None:
    offenders = sorted(
        path.relative_to(REPO).as_posix()
        for path in (TASKS / stage).rglob("*.py")
        if path.name != WRAPPER and _imported(path) & {"prefect", "prefect_dask"}
    )
    assert not offenders, f"Prefect outside tasks/{stage}/{WRAPPER}: {offenders}"


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_nothing_from_flows(stage: str) -> None:
    offenders = sorted(
        path.relative_to(REPO).as_posix()
        for path in (TASKS / stage).rglob("*.py")
        if "flows" in _imported(path)
    )
    assert not offenders, f"tasks/{stage} imports flows (imports go flows → tasks): {offenders}"


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_package_exports_a_closed_sorted_all(stage: str) -> None:
    package = importlib.import_module(f"tasks.{stage}")
    assert package.__doc__, f"tasks/{stage}/__init__.py says what the stage does"
    assert package.__all__ == sorted(package.__all__, key=str)
    for name in package.__all__:
        assert hasattr(package, name), f"tasks.{stage}.{name} is in __all__ but missing"
