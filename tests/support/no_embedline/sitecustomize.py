"""A Python whose path holds this folder cannot import embedline's packages: a Dask worker
started so is a worker installed without embedline (tests/integration/test_dask_external.py)."""

import sys
from importlib.machinery import ModuleSpec

_PACKAGES = ("adapters", "cli", "embedline", "flows", "tasks")


class _NoEmbedline:
    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name.split(".")[0] in _PACKAGES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoEmbedline())  # type: ignore[arg-type]
