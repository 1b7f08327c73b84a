"""``python -m cli``: the same as the ``embedline`` console script."""

from cli import entry

entry()
