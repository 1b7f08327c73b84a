"""The embedding API key in a Prefect ``Secret`` block, for processes that run the flow.

The ``embed-csv`` flow never takes the key as a parameter (parameters are stored and shown by
Prefect): the openai embedder reads ``EMBEDLINE_API_KEY``, else ``OPENAI_API_KEY``, from the
environment of the process that runs the flow. Two ways to get it there on a worker:

- export it in the worker's environment before ``prefect worker start`` (flow runs inherit it);
- or keep it in a ``Secret`` block and let the process that runs the flow copy it into its
  environment: ``export_api_key_from_block()`` below.

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

__all__ = ["BLOCK_ENV", "DEFAULT_BLOCK", "export_api_key_from_block", "main"]

#: Name of the ``Secret`` block holding the key, unless ``$EMBEDLINE_API_KEY_BLOCK`` names one.
DEFAULT_BLOCK = "embedline-api-key"
BLOCK_ENV = "EMBEDLINE_API_KEY_BLOCK"
_KEY_ENVS = ("EMBEDLINE_API_KEY", "OPENAI_API_KEY")


def export_api_key_from_block(block_name: str | None = None) -> bool:
    """Copy the key from a ``Secret`` block into ``os.environ["EMBEDLINE_API_KEY"]``.

    Does nothing when ``EMBEDLINE_API_KEY`` or ``OPENAI_API_KEY`` is already set (the
    environment wins). The block is ``block_name``, else ``$EMBEDLINE_API_KEY_BLOCK``, else
    ``embedline-api-key``; a missing block is not an error unless it was named explicitly
    (argument or environment). Child processes started afterwards (flow runs of
    ``prefect.serve``) inherit the variable. The value is never logged or printed.

    :returns: True if the variable was set from the block.
    :raises ValueError: an explicitly named block does not exist, or holds no string.
    """
    if any(os.environ.get(name) for name in _KEY_ENVS):
        return False
    from prefect.blocks.system import Secret

    explicit = block_name or os.environ.get(BLOCK_ENV)
    try:
        secret = Secret.load(explicit or DEFAULT_BLOCK)
    except ValueError:
        if explicit:
            raise ValueError(f"no Secret block named {explicit!r} (set by {BLOCK_ENV} or "
                             "argument); create it with deployments/api_key.py store") from None
        return False
    value = secret.get()
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"Secret block {explicit or DEFAULT_BLOCK!r} does not hold a key string")
    os.environ["EMBEDLINE_API_KEY"] = value.strip()
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``store [--block NAME]``: save a key read from the terminal or stdin as a Secret block."""
    parser = argparse.ArgumentParser(prog="python deployments/api_key.py")
    sub = parser.add_subparsers(dest="command", required=True)
    store = sub.add_parser("store", help="save the key (from the terminal or stdin) in a block")
    store.add_argument("--block", default=os.environ.get(BLOCK_ENV) or DEFAULT_BLOCK)
    args = parser.parse_args(argv)
    if sys.stdin.isatty():
        key = getpass.getpass("API key (not echoed): ")
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key:
        print("api_key.py: error: empty key", file=sys.stderr)
        return 2
    from prefect.blocks.system import Secret

    Secret(value=key).save(args.block, overwrite=True)
    print(f"saved the key in Secret block {args.block!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
