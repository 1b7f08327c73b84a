"""``--dask-cluster-class``: the cluster class prefect-dask's ``DaskTaskRunner`` starts for a
run (its ``cluster_class``, called with ``cluster_kwargs``), imported here first so that a
class that is not installed, or not there, is one line and exit 2 instead of a traceback
from inside the task runner. No Prefect or Dask import at module import: the CLI checks the
class before Prefect starts."""

from __future__ import annotations

import importlib
from typing import Any

from embedline.errors import InputError

__all__ = ["cluster_class"]


def cluster_class(path: str) -> Any:
    """The callable at import path ``path`` (``module.Class``; the longest importable module
    prefix, then attributes: ``dask_kubernetes.operator.KubeCluster``).

    :raises InputError: no module of the path imports, the attribute is missing, or it is
        not callable.
    """
    parts = path.split(".")
    module: Any = None
    rest: list[str] = []
    problem = ""
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            problem = problem or str(exc)
            if exc.name is not None and (name + ".").startswith(exc.name + "."):
                continue  # this prefix is not a module: try a shorter one
            module = None  # the module is there, a package it imports is not
            break
        except ImportError as exc:
            problem = str(exc)
            break
        rest = parts[cut:]
        break
    if module is None:
        raise InputError(
            f"--dask-cluster-class {path}: cannot import it ({problem}): install its package "
            "where the flow runs"
        )
    found: Any = module
    for name in rest:
        found = getattr(found, name, None)
        if found is None:
            raise InputError(
                f"--dask-cluster-class {path}: {module.__name__} has no {'.'.join(rest)}"
            )
    if not callable(found):
        raise InputError(f"--dask-cluster-class {path}: not a class ({type(found).__name__})")
    return found
