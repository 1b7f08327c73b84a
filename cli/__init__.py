"""The ``embedline`` command line (DESIGN §3, a contract): an entry point above ``flows/``.

One module per command group: ``run`` (run, retry-failed), ``inspect`` (status,
dead-letters). Prefect and the adapters are imported inside the commands, so ``--help`` and
usage errors answer at once.
"""

import time

#: ``time.monotonic()`` when the command started (this package is its first import).
STARTED_AT = time.monotonic()

from cli.main import main  # noqa: E402 - after STARTED_AT, which it reads

__all__ = ["STARTED_AT", "main"]
