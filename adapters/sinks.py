"""Vector-store sinks: parse a sink URI and open the matching adapter (DESIGN §8).

Accepted forms:

- ``lancedb://PATH[?table=NAME]``: an embedded LanceDB database directory (no server);
  the table defaults to ``embeddings``. PATH is taken literally (no percent-decoding; ``#``,
  spaces, ``+`` kept); the text after the LAST ``?`` is embedline's own ``table=NAME``, so a
  PATH holding ``?`` needs ``?table=NAME`` after it (else it is refused, pointing to it and
  to the next form).
- ``PATH/NAME.lance``: the same, naming the table by its directory (LanceDB keeps table
  ``NAME`` of database ``PATH`` in ``PATH/NAME.lance``); every character of PATH is literal.
- ``postgresql://[user@]host[:port]/db[?libpq-params][&table=NAME]`` (or ``postgres://``):
  pgvector on PostgreSQL. The password is never taken from the URI (it would end up in
  shell history, Prefect parameters and the ledger): libpq reads ``PGPASSWORD`` or
  ``~/.pgpass`` (https://www.postgresql.org/docs/current/libpq-envars.html).
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from adapters.sink_meta import SINK_FORMAT, check_compatible, sink_metadata, sink_table_from_metadata
from adapters.uris import scheme_of
from embedline.errors import FatalError, InputError
from embedline.protocols import VectorSink

__all__ = ["DEFAULT_TABLE", "SINK_FORMAT", "check_compatible", "open_sink", "sink_metadata",
           "sink_table_from_metadata", "validate_sink_uri"]  # fmt: skip

DEFAULT_TABLE = "embeddings"

_TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")  # a PostgreSQL identifier, unquoted
_FORMS = ("accepted forms: lancedb://PATH[?table=NAME], PATH/NAME.lance, "
          "postgresql://user@host:port/db[?table=NAME]")  # fmt: skip


def _table_name(name: str, shown: str) -> str:
    if not _TABLE_RE.match(name):
        raise InputError(f"sink {shown}: table name {name!r} must be letters, digits and _ "
                         "(at most 63, not starting with a digit)")  # fmt: skip
    return name


def _split_table(query: str, shown: str) -> tuple[str, str]:
    """Return ``(table, query without table)``."""
    pairs = parse_qsl(query, keep_blank_values=True)
    tables = [v for k, v in pairs if k == "table"]
    rest = [(k, v) for k, v in pairs if k != "table"]
    if len(tables) > 1:
        raise InputError(f"sink {shown}: 'table' given more than once")
    return _table_name(tables[0] if tables else DEFAULT_TABLE, shown), urlencode(rest)


def _redacted(uri: str) -> str:
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/@:]*):[^/@]*@", r"\1\2:***@", uri)


def validate_sink_uri(uri: str) -> str:
    """Return ``uri`` if it names a sink embedline can open; never connects.

    :raises InputError: unknown form, a password in the URI, a bad table name.
    """
    _parse(uri)
    return uri


def _parse(uri: str) -> tuple[str, dict[str, str]]:
    text = (uri or "").strip()
    shown = _redacted(text)
    if not text:
        raise InputError(f"--sink is empty; {_FORMS}")
    scheme = scheme_of(text)
    if scheme in ("postgresql", "postgres"):
        parts = urlsplit(text)  # a libpq URI: RFC 3986 rules, percent-decoded by libpq
        if parts.password:
            raise InputError(f"sink {shown}: a password in the URI is not accepted; set "
                             "PGPASSWORD (or use ~/.pgpass) and leave it out of the URI")
        table, query = _split_table(parts.query, shown)
        netloc = parts.netloc.split("@")
        user_host = (netloc[0].split(":")[0] + "@" + netloc[1]) if len(netloc) == 2 else netloc[0]
        dsn = urlunsplit((scheme, user_host, parts.path, query, ""))
        return "pgvector", {"dsn": dsn, "table": table}
    if scheme == "lancedb":
        # The text after the LAST '?' is embedline's own query, so a sink's identity
        # (lancedb://ABSPATH?table=NAME) names its path literally whatever it holds.
        path, mark, query = text[len("lancedb://"):].rpartition("?")
        if not mark:
            path, query = query, ""
        if not path:
            raise InputError(f"sink {shown}: no database path; {_FORMS}")
        table, query = _split_table(query, shown)
        if query:
            raise InputError(f"sink {shown}: only ?table=NAME is accepted after the path (a "
                             "path holding '?' needs ?table=NAME after it, or write the sink "
                             f"as PATH/NAME.lance); {_FORMS}")
        return "lancedb", {"path": os.path.abspath(path), "table": table}
    if scheme == "" and text.rstrip("/").endswith(".lance"):
        path = os.path.abspath(text.rstrip("/"))
        name = os.path.basename(path)[: -len(".lance")]
        return "lancedb", {"path": os.path.dirname(path), "table": _table_name(name, shown)}
    raise InputError(f"unsupported sink {shown}; {_FORMS}")


def open_sink(uri: str) -> VectorSink:
    """Open the sink named by ``uri`` (connects lazily, on first use).

    :raises InputError: see ``validate_sink_uri``.
    :raises FatalError: the sink's client library is not installed.
    """
    kind, params = _parse(uri)
    if kind == "lancedb":
        from adapters.sink_lancedb import LanceDBSink

        return LanceDBSink(params["path"], table=params["table"])
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError:
        raise FatalError("the pgvector sink needs psycopg and pgvector: pip install "
                         "'embedline[pgvector]'") from None  # fmt: skip
    from adapters.sink_pgvector import PgVectorSink

    return PgVectorSink(params["dsn"], table=params["table"])
