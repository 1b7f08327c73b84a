"""The embedding API key from a Prefect ``Secret`` block, for the process that runs the flow.

The key is never a flow parameter (Prefect stores and shows parameters); the openai embedder
reads ``EMBEDLINE_API_KEY``, else ``OPENAI_API_KEY``, from the environment. This copies it
there from a block: ``deployments/api_key.py store`` saves it, ``deployments/serve.py`` and
the ``embed-csv`` flow call ``export_api_key_from_block``.
"""

from __future__ import annotations

import os

__all__ = ["BLOCK_ENV", "DEFAULT_BLOCK", "export_api_key_from_block"]

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
            raise ValueError(
                f"no Secret block named {explicit!r} (set by {BLOCK_ENV} or "
                "argument); create it with deployments/api_key.py store"
            ) from None
        return False
    value = secret.get()  # type: ignore[union-attr]  # sync_compatible: sync caller, no coroutine
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"Secret block {explicit or DEFAULT_BLOCK!r} does not hold a key string")
    os.environ["EMBEDLINE_API_KEY"] = value.strip()
    return True
