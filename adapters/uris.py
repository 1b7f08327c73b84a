"""The one parser that turns a user's URI into a bucket and key (or a local path), literally.

Every place that names an object or a directory (the input, ``--output``, ``load``,
``search``, ``gc``, Dask workers that reopen a store from its URI, the LanceDB sink) goes
through ``split_location``; none uses ``urllib.parse`` for it. The rules (docs/reference/cli.md,
"Names are literal"):

- ``s3://BUCKET/KEY``: the key is every character after the first ``/`` following the
  bucket, exactly as written — ``#``, ``?``, ``%``, ``+``, spaces and non-ASCII are part of
  the key (S3 keys are any UTF-8, AWS S3 user guide "Naming objects"; botocore percent-encodes
  the key on the wire). Nothing is percent-decoded: ``%20`` is the three characters ``%20``.
- A plain path (no ``scheme://``) is literal too: ``./out#1`` is the directory ``out#1``.
- ``file://`` URIs are URIs (RFC 8089 §2, RFC 3986 §2.1): their path is percent-decoded
  (``%20`` → space, ``%23`` → ``#``) and a raw ``?`` or ``#`` (a query or fragment in
  RFC 3986) is refused with a message saying to write ``%3F``/``%23`` or a plain path.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple
from urllib.parse import unquote

from embedline.errors import InputError

__all__ = ["LIBPQ_SECRET_PARAMS", "Location", "redact", "scheme_of", "split_location"]

_SCHEME_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
# AWS bucket naming rules allow only lowercase letters, digits, '.', '-'; S3-compatible
# stores also accept uppercase and '_'. Anything else (a '?', '#', '@', space) is a typo or a
# URI that meant something else: refuse it rather than guess.
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
#: libpq's connection parameters that hold a secret (PostgreSQL 18 documentation, libpq
#: "Parameter Key Words"): redacted here, refused in a sink URI (``adapters.sinks.factory``).
LIBPQ_SECRET_PARAMS = ("password", "sslpassword", "oauth_client_secret")
#: Query parameters whose value is hidden in messages: libpq's secrets and the names API
#: keys go by in other stores' URIs (``qdrant://host/c?api_key=…``, refused there too).
_SECRET_QUERY_PARAMS = (*LIBPQ_SECRET_PARAMS, "api_key", "apikey", "api-key", "key", "token")
_SECRET_QUERY_RE = re.compile(
    rf"([?&](?:{'|'.join(map(re.escape, _SECRET_QUERY_PARAMS))}|[a-z_-]*secret[a-z_-]*)=)[^&#]*",
    re.IGNORECASE,
)
# RFC 3986 §3.2.1: userinfo is "user:password", the password everything after its first ":"
# and up to the authority's last "@" (a raw "@" in a password is invalid but written).
_USERINFO_PASSWORD_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@:]*):[^/?#]*@")
_USERINFO_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#]*@")
_USER_IS_NO_SECRET = ("postgresql", "postgres")


class Location(NamedTuple):
    """Where a URI points: ``kind`` is ``"s3"`` (``bucket`` and ``key``; ``key`` may be ``""``
    for a bucket root) or ``"local"`` (``path``, a filesystem path, ``bucket``/``key`` empty)."""

    kind: str
    bucket: str = ""
    key: str = ""
    path: str = ""


def redact(uri: str) -> str:
    """Return ``uri`` for messages, its secrets replaced by ``***``: the value of a secret
    query parameter (libpq's ``LIBPQ_SECRET_PARAMS``, an ``api_key``, ``key``, ``token`` or
    any ``*secret*``) and the ``user:password@`` part. In
    a PostgreSQL URI only the password goes: the user names whom a server refused, as
    SQLAlchemy's ``hide_password`` shows it; elsewhere a lone user part may be an API key
    (``qdrant://KEY@host``), so all of it goes."""
    if scheme_of(uri) in _USER_IS_NO_SECRET:
        shown = _USERINFO_PASSWORD_RE.sub(r"\1:***@", uri)
    else:
        shown = _USERINFO_RE.sub(r"\1***@", uri)
    return _SECRET_QUERY_RE.sub(r"\1***", shown)


def scheme_of(uri: str) -> str:
    """Return the lowercased scheme of ``scheme://…`` or ``""`` for a plain path (a Windows
    ``C:\\`` drive is a plain path)."""
    found = _SCHEME_RE.match(uri)
    if found is None or (len(found["scheme"]) == 1 and os.name == "nt"):
        return ""
    return found["scheme"].lower()


def split_location(uri: str, *, what: str, forms: str) -> Location:
    """Split ``uri`` into a ``Location`` without decoding or dropping any character of an S3
    key or a plain path (see the module docstring for the rules and their sources).

    ``what`` names the argument in messages (``"--output"``, ``"input"``); ``forms`` is the
    accepted-forms hint appended to them.

    :raises InputError: one line naming the URI: empty, an unsupported scheme, credentials
        in an ``s3://`` URI, no bucket or an invalid bucket name, a ``file://`` URI that is
        not absolute or holds a raw ``?``/``#``.
    """
    text = uri.strip() if isinstance(uri, str) else ""
    if not text:
        raise InputError(f"{what} is empty; {forms}")
    scheme = scheme_of(text)
    if scheme == "":
        return Location("local", path=text)
    shown = redact(text)
    rest = text[len(scheme) + 3 :]
    if scheme == "s3":
        bucket, _, key = rest.partition("/")
        if "@" in bucket:
            raise InputError(
                f"{what} {shown}: credentials in the URI are not accepted (use "
                f"the AWS configuration chain); {forms}"
            )
        if not bucket:
            raise InputError(f"{what} {shown}: no bucket name; {forms}")
        if not _BUCKET_RE.match(bucket):
            raise InputError(
                f"{what} {shown}: {bucket!r} is not a valid bucket name (letters,"
                f" digits, '.', '-', '_'); {forms}"
            )
        return Location("s3", bucket=bucket, key=key)
    if scheme == "file":
        return Location("local", path=_file_path(rest, shown, what=what, forms=forms))
    raise InputError(f"{what} {shown}: unsupported scheme {scheme!r}; {forms}")


def _file_path(rest: str, shown: str, *, what: str, forms: str) -> str:
    """The decoded absolute path of ``file://`` + ``rest`` (RFC 8089: host empty or
    ``localhost``, the path percent-decoded as UTF-8)."""
    if "?" in rest or "#" in rest:
        raise InputError(
            f"{what} {shown}: a raw '?' or '#' in a file:// URI starts a query or "
            "fragment (RFC 3986); write it as %3F / %23, or give a plain path"
        )
    host, slash, path = rest.partition("/")
    if host not in ("", "localhost") or not slash:
        raise InputError(
            f"{what} {shown}: a file URI needs an absolute path (file:///abs/path); {forms}"
        )
    try:
        return unquote("/" + path, errors="strict")
    except UnicodeDecodeError:
        raise InputError(
            f"{what} {shown}: its percent-escapes are not UTF-8 (RFC 3986 §2.5); give a plain path"
        ) from None
