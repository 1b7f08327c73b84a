"""MkDocs hook: links from a page to files outside ``docs/`` become code text on the site.

The pages link to the README, ``deployments/`` and ``benchmarks/`` with relative paths, so they
work when read in a checkout or on a forge. MkDocs cannot serve those files and ``--strict``
would fail on them; this hook rewrites such a link to its text plus the repo path in code
style. ``tests/unit/test_docs.py`` checks that every relative link resolves in the repo.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Rewrite ``[text](path)`` whose target leaves ``docs_dir`` to ``text (`path`)``."""
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if "://" in target or target.startswith(("mailto:", "/")):
            return match.group(0)
        resolved = posixpath.normpath(posixpath.join(here, target))
        if not resolved.startswith("../"):
            return match.group(0)
        repo_path = resolved[len("../") :]
        return text if f"`{repo_path}`" in text else f"{text} (`{repo_path}`)"

    return _LINK.sub(rewrite, markdown)
