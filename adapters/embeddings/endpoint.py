"""Where the OpenAI-compatible client sends its requests and how it authenticates: the
endpoint URL, the API key from the environment, the header that carries it, and the checks
that refuse what a request could never carry. No request is sent here.

Rule sources: RFC 9110 §5.1 (field names, ``embedline.http_names``) and §11.6.2
(``Authorization``); OpenAI API reference, "Authentication" (``Bearer`` keys).
"""

from __future__ import annotations

import os
import re

import httpx

from embedline.errors import FatalError, InputError
from embedline.http_names import is_field_name

__all__ = [
    "AUTH_HEADER_ENV",
    "api_key_from_env",
    "auth_header_for",
    "auth_headers",
    "auth_hint",
    "check_api_key",
    "check_header_name",
    "endpoint_url",
    "new_http_client",
    "safe_url",
]

#: Environment variable naming the header that carries the API key (``--auth-header``).
AUTH_HEADER_ENV = "EMBEDLINE_AUTH_HEADER"

_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what a Bearer token may hold


def auth_header_for(setting: str | None) -> str:
    """The header that carries the key: ``--auth-header``, else ``$EMBEDLINE_AUTH_HEADER``,
    else ``Authorization`` (sent as ``Bearer KEY``)."""
    return setting or os.environ.get(AUTH_HEADER_ENV) or "Authorization"


def api_key_from_env() -> str | None:
    """Return ``EMBEDLINE_API_KEY``, else ``OPENAI_API_KEY``; an empty value counts as unset."""
    for name in ("EMBEDLINE_API_KEY", "OPENAI_API_KEY"):
        value = os.environ.get(name)
        if value:
            return value
    return None


def auth_headers(api_key: str | None, header: str) -> dict[str, str]:
    """The request headers that carry ``api_key``: ``Authorization: Bearer KEY``, or
    ``HEADER: KEY`` for another header; none without a key."""
    if not api_key:
        return {}
    if header.lower() == "authorization":
        return {"Authorization": f"Bearer {api_key}"}
    return {header: api_key}


def auth_hint(api_key: str | None, header: str) -> str:
    """What a 401/403 message says about the key and the header that carried it."""
    if api_key is None:
        return (
            "no API key was sent: set EMBEDLINE_API_KEY (or OPENAI_API_KEY), and "
            "--auth-header if the gateway reads the key from another header"
        )
    if header.lower() == "authorization":
        return (
            "the key was sent as 'Authorization: Bearer …': check EMBEDLINE_API_KEY "
            "(or OPENAI_API_KEY), or pass --auth-header api-key if the gateway "
            "(Azure-style) expects the key in another header"
        )
    return (
        f"the key was sent in the {header!r} header (--auth-header or "
        "EMBEDLINE_AUTH_HEADER): check EMBEDLINE_API_KEY (or OPENAI_API_KEY) and "
        "the header name the gateway expects"
    )


def check_api_key(api_key: str | None) -> None:
    """:raises FatalError: if the key holds characters a header cannot carry (never echoed)."""
    if api_key and not _KEY_CHARS.fullmatch(api_key):
        raise FatalError(
            "the API key in EMBEDLINE_API_KEY/OPENAI_API_KEY contains whitespace or "
            "non-ASCII characters (a trailing newline?); set it to the bare key"
        )


def check_header_name(name: str) -> None:
    """:raises InputError: if ``name`` cannot be an HTTP field name (RFC 9110 §5.1)."""
    if not is_field_name(name):
        raise InputError(f"--auth-header {name!r} is not a valid HTTP header name")


def endpoint_url(base_url: str) -> httpx.URL:
    """``{base_url}/embeddings``, keeping any query string. :raises InputError: if not http(s)."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        raise InputError(f"--base-url is not a valid URL: {safe_url(base_url)!r}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError(f"--base-url must be an http(s) URL, got {safe_url(base_url)!r}")
    return url.copy_with(path=url.path.rstrip("/") + "/embeddings")


def safe_url(base_url: str) -> str:
    """``base_url`` without user info (which may hold a password)."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        return "<invalid URL>"
    return str(url.copy_with(username=None, password=None)) if url.userinfo else base_url


def new_http_client(timeout_s: float, concurrency: int) -> httpx.Client:
    """An ``httpx.Client`` with ``concurrency`` pooled connections and ``timeout_s`` seconds
    for each of connect, read, write and pool."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.Client(timeout=httpx.Timeout(timeout_s), limits=limits)
