"""``python -m cli``: the same as the ``embedline`` console script."""

import sys

from cli import main

sys.exit(main())
