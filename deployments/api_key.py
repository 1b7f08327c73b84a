"""The embedding API key in a Prefect ``Secret`` block, for processes that run the flow.

The ``embed-csv`` flow never takes the key as a parameter (parameters are stored and shown by
Prefect): the openai embedder reads ``EMBEDLINE_API_KEY``, else ``OPENAI_API_KEY``, from the
environment of the process that runs the flow. Two ways to get it there on a worker:

- export it in the worker's environment before ``prefect worker start`` (flow runs inherit it);
- or keep it in a ``Secret`` block and let the process that runs the flow copy it into its
  environment: ``flows.api_key.export_api_key_from_block()`` (the flow and
  ``deployments/serve.py`` call it).

Store the key in the block (reads it from the terminal without echo, or from stdin; never from
the command line, which would leave it in the shell history)::

    .venv/bin/python deployments/api_key.py store                 # block "embedline-api-key"
    .venv/bin/python deployments/api_key.py store --block other   # or $EMBEDLINE_API_KEY_BLOCK

(Named ``api_key.py``, not ``secrets.py``: ``python deployments/serve.py`` puts this folder
first on ``sys.path``, where a ``secrets.py`` would shadow the standard library's ``secrets``.)
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence

from flows.api_key import BLOCK_ENV, DEFAULT_BLOCK

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``store [--block NAME]``: save a key read from the terminal or stdin as a Secret block."""
    parser = argparse.ArgumentParser(prog="python deployments/api_key.py")
    sub = parser.add_subparsers(dest="command", required=True)
    store = sub.add_parser("store", help="save the key (from the terminal or stdin) in a block")
    store.add_argument("--block", default=os.environ.get(BLOCK_ENV) or DEFAULT_BLOCK)
    args = parser.parse_args(argv)
    key = getpass.getpass("API key (not echoed): ") if sys.stdin.isatty() else sys.stdin.readline()
    key = key.strip()
    if not key:
        print("api_key.py: error: empty key", file=sys.stderr)
        return 2
    from prefect.blocks.system import Secret

    Secret(value=key).save(args.block, overwrite=True)  # type: ignore[arg-type]  # validated to SecretStr
    print(f"saved the key in Secret block {args.block!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
