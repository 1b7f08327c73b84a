"""``flows.dask_preload``: a Dask worker's start-up hook that acts only when Dask calls it."""

from __future__ import annotations

import importlib
import signal


def test_importing_the_worker_preload_leaves_the_process_as_it_was() -> None:
    """A test process that imported ``flows.dask_preload`` (the module-state check imports
    every module) ignored SIGINT from then on, and so did every CLI it started: a Ctrl-C
    test run after it in the same process failed. The preload acts in ``dask_setup``."""
    before = signal.getsignal(signal.SIGINT)
    module = importlib.import_module("flows.dask_preload")
    importlib.reload(module)  # executed again, whoever imported it first
    assert signal.getsignal(signal.SIGINT) is before
    assert callable(module.dask_setup)
