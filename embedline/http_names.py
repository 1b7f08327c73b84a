"""HTTP field names (RFC 9110 §5.1): the one rule both the settings and the embedding client
check ``--auth-header`` against. Pure: no I/O.

Rule source: RFC 9110 §5.6.2 ``token = 1*tchar``, ``tchar = "!" / "#" / "$" / "%" / "&" /
"'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA``.
"""

from __future__ import annotations

import re

__all__ = ["HTTP_TOKEN", "is_field_name"]

#: An RFC 9110 §5.6.2 token: what a header (field) name may be.
HTTP_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def is_field_name(name: str | None) -> bool:
    """True if ``name`` is a non-empty RFC 9110 token, i.e. can be sent as a header name."""
    return bool(name) and HTTP_TOKEN.fullmatch(name or "") is not None
