"""A Dask worker preload for tests that shorten the scheduler's ``worker-ttl``: it imports
what a chunk task needs while the worker starts, before it registers. The flow's warm-up
(``client.run``) then finds those imports done: run on the worker's event loop, they would
hold its heartbeats for seconds on a busy machine, and a short ``worker-ttl`` would remove
the worker before the run begins."""

from __future__ import annotations

import pandas  # noqa: F401
import prefect.task_engine  # noqa: F401
import pyarrow.parquet  # noqa: F401

import tasks.embed.task  # noqa: F401
