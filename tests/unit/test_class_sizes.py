"""No class in the shipped packages has more than 25 methods: a class that grows past that
holds several responsibilities, and is split along them (as the stop state was: its phase,
what stops a dispatch, what the command reports, the hard-exit hooks).

Counted from the AST: the functions defined in the class body (properties, dunder and private
methods included), not inherited ones."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("embedline", "adapters", "tasks", "flows", "cli")
MAX_METHODS = 25


def _method_counts() -> dict[str, int]:
    counts = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    methods = [
                        item
                        for item in node.body
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    ]
                    where = f"{path.relative_to(REPO)}:{node.lineno} {node.name}"
                    counts[where] = len(methods)
    return counts


def test_no_class_has_more_than_25_methods() -> None:
    counts = _method_counts()
    assert counts, "no class found: the scan looks in the wrong place"
    too_big = {where: n for where, n in counts.items() if n > MAX_METHODS}
    assert too_big == {}, f"split these along their responsibilities: {too_big}"
