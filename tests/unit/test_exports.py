"""Each package exports a closed, sorted ``__all__``, and the packages are this repo's own
(``adapters``, ``tasks`` and ``flows`` are also names of unrelated PyPI projects)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", ["embedline", "adapters", "tasks", "flows", "cli"])
def test_package_exports_exist_and_come_from_this_repo(package: str) -> None:
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().is_relative_to(REPO)
    assert module.__all__ == sorted(module.__all__, key=str)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.{name} is in __all__ but missing"


def test_core_imports_neither_prefect_nor_adapters() -> None:
    code = (
        "import sys, embedline, embedline.retry, embedline.shutdown, embedline.exit_cleanups; "
        "bad = [m for m in ('prefect', 'adapters', 'tasks', 'flows', 'boto3', 'httpx') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
