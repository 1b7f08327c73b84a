"""The ``embedline`` command line (DESIGN §3, a contract): an entry point above ``flows/``.

One module per command group: ``run`` (run, retry-failed), ``inspect`` (status,
dead-letters). Prefect and the adapters are imported inside the commands, so ``--help`` and
usage errors answer at once.
"""

from cli.main import main

__all__ = ["main"]
