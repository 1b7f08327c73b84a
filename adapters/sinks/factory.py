"""Open a vector-store sink from its URI (docs/reference/sinks.md): which store a URI names, and
how.

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
- ``qdrant://HOST[:PORT]/COLLECTION`` (HTTP, port 6333 by default) or
  ``qdrant+https://HOST[:PORT]/COLLECTION`` (TLS): a Qdrant server. The API key comes from
  ``QDRANT_API_KEY`` only; a ``key@`` in the URI is refused.
- ``qdrant+local://PATH[?collection=NAME]``: ``qdrant-client``'s embedded local mode, a
  directory (no server); the collection defaults to ``embeddings``. PATH is taken literally
  as for ``lancedb://`` (the text after the LAST ``?`` is embedline's ``collection=NAME``).

Each store is one ``SinkKind`` in ``KINDS``: the URIs it claims, how they parse (here, so a
URI is checked without importing the store or its client library), and an opener that
imports the store module only when a sink is opened, as dlt's destination factories import
their client class (dlt/destinations/impl/lancedb/factory.py ``client_class``). A new store
is its module plus one entry here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from adapters.sinks.base import DEFAULT_TABLE
from adapters.uris import LIBPQ_SECRET_PARAMS, redact, scheme_of
from embedline.errors import FatalError, InputError
from embedline.protocols import AliasSwitch, VectorSink

__all__ = [
    "KINDS",
    "SinkKind",
    "is_sink_uri",
    "loaded_identity",
    "open_alias",
    "open_sink",
    "sink_uri_for_table",
    "validate_sink_uri",
]

_TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")  # a PostgreSQL identifier, unquoted


@dataclass(frozen=True, slots=True)
class SinkKind:
    """One store the factory can open.

    ``claims(scheme, text)``: whether the stripped URI ``text`` (of lowercased ``scheme``,
    ``""`` for a plain path) names this store. ``parse(text, scheme, shown)``: the keyword
    arguments ``open`` takes, never connecting (``shown`` is ``text`` redacted, for
    messages); raises ``InputError``. ``open(params)``: the sink, connecting lazily; raises
    ``FatalError`` when the store's client library is not installed.
    """

    name: str  # "lancedb", "pgvector", "qdrant": the store, as ``_parse`` reports it
    forms: tuple[str, ...]  # the accepted-form hints listed in every refusal
    claims: Callable[[str, str], bool]
    parse: Callable[[str, str, str], dict[str, str]]
    open: Callable[[dict[str, str]], VectorSink]
    # model cutover (``open_alias``): the params naming another table of the same store,
    # and the store's alias switch; None for a store without aliases or views (LanceDB)
    retable: Callable[[dict[str, str], str], dict[str, str]] | None = None
    alias: Callable[[dict[str, str], str, VectorSink | None], AliasSwitch] | None = None


def _table_name(name: str, shown: str) -> str:
    if not _TABLE_RE.match(name):
        raise InputError(
            f"sink {shown}: table name {name!r} must be letters, digits and _ "
            "(at most 63, not starting with a digit)"
        )
    return name


def _split_table(query: str, shown: str) -> tuple[str, str]:
    """Return ``(table, query without table)``."""
    pairs = parse_qsl(query, keep_blank_values=True)
    tables = [v for k, v in pairs if k == "table"]
    rest = [(k, v) for k, v in pairs if k != "table"]
    if len(tables) > 1:
        raise InputError(f"sink {shown}: 'table' given more than once")
    return _table_name(tables[0] if tables else DEFAULT_TABLE, shown), urlencode(rest)


# --- LanceDB ---------------------------------------------------------------------------


def _lancedb_claims(scheme: str, text: str) -> bool:
    return scheme == "lancedb" or (scheme == "" and text.rstrip("/").endswith(".lance"))


def _a_directory(path: str, shown: str) -> str:
    """``path`` (absolute), which is a directory or can be made one: refused if it, or what
    exists of its parents, is a file (the store would fail at open, after the run).

    :raises InputError: naming the file.
    """
    probe = path
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if os.path.lexists(probe) and not os.path.isdir(probe):
        raise InputError(
            f"sink {shown}: {probe} is a file; the sink's path names a directory, which "
            "holds the database (created if absent)"
        )
    return path


def _lancedb_parse(text: str, scheme: str, shown: str) -> dict[str, str]:
    if scheme == "":  # PATH/NAME.lance
        path = _a_directory(os.path.abspath(text.rstrip("/")), shown)
        name = os.path.basename(path)[: -len(".lance")]
        return {"path": os.path.dirname(path), "table": _table_name(name, shown)}
    # The text after the LAST '?' is embedline's own query, so a sink's identity
    # (lancedb://ABSPATH?table=NAME) names its path literally whatever it holds.
    path, mark, query = text[len("lancedb://") :].rpartition("?")
    if not mark:
        path, query = query, ""
    if not path:
        raise InputError(f"sink {shown}: no database path; {_forms()}")
    table, query = _split_table(query, shown)
    if query:
        raise InputError(
            f"sink {shown}: only ?table=NAME is accepted after the path (a "
            "path holding '?' needs ?table=NAME after it, or write the sink "
            f"as PATH/NAME.lance); {_forms()}"
        )
    return {"path": _a_directory(os.path.abspath(path), shown), "table": table}


def _lancedb_open(params: dict[str, str]) -> VectorSink:
    from adapters.sinks.lancedb import LanceDBSink

    return LanceDBSink(params["path"], table=params["table"])


# --- pgvector --------------------------------------------------------------------------


def _pgvector_claims(scheme: str, text: str) -> bool:
    return scheme in ("postgresql", "postgres")


def _pgvector_parse(text: str, scheme: str, shown: str) -> dict[str, str]:
    parts = urlsplit(text)  # a libpq URI: RFC 3986 rules, percent-decoded by libpq
    if parts.password:
        raise _password_refused(shown)
    if "?" in parts.query:
        raise InputError(
            f"sink {shown}: a second '?' in the URI; join its query parameters with '&' "
            "(postgresql://[user@]host[:port]/db?param=value&table=NAME)"
        )
    table, query = _split_table(parts.query, shown)
    _check_libpq_params(query, shown)
    netloc = parts.netloc.split("@")
    user_host = (netloc[0].split(":")[0] + "@" + netloc[1]) if len(netloc) == 2 else netloc[0]
    dsn = urlunsplit((scheme, user_host, parts.path, query, ""))
    return {"dsn": dsn, "table": table}


#: libpq's connection parameter key words (PostgreSQL 18 documentation, libpq "Parameter Key
#: Words"), which a ``postgresql://`` URI's query may carry besides embedline's ``table``.
_LIBPQ_PARAMS = frozenset(
    [
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "require_auth",
        "channel_binding",
        "connect_timeout",
        "client_encoding",
        "options",
        "application_name",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "replication",
        "gssencmode",
        "sslmode",
        "requiressl",
        "sslnegotiation",
        "sslcompression",
        "sslcert",
        "sslkey",
        "sslkeylogfile",
        "sslpassword",
        "sslcertmode",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "requirepeer",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "min_protocol_version",
        "max_protocol_version",
        "krbsrvname",
        "gsslib",
        "gssdelegation",
        "scram_client_key",
        "scram_server_key",
        "service",
        "target_session_attrs",
        "load_balance_hosts",
        "oauth_issuer",
        "oauth_client_id",
        "oauth_client_secret",
        "oauth_scope",
    ]
)


#: libpq parameters that take one of a few words (PostgreSQL 18 manual, "Parameter Key
#: Words"): libpq checks the value only when it connects.
_LIBPQ_CHOICES = MappingProxyType(
    {
        "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
        "gssencmode": ("disable", "prefer", "require"),
        "channel_binding": ("disable", "prefer", "require"),
        "sslnegotiation": ("postgres", "direct"),
        "sslcertmode": ("disable", "allow", "require"),
        "target_session_attrs": (
            "any", "read-write", "read-only", "primary", "standby", "prefer-standby",
        ),
        "load_balance_hosts": ("disable", "random"),
        "sslcompression": ("0", "1"),
        "sslsni": ("0", "1"),
        "requiressl": ("0", "1"),
        "keepalives": ("0", "1"),
    }
)  # fmt: skip
#: libpq parameters that take an integer (``port``: one per host, comma-separated).
_LIBPQ_INTEGERS = frozenset(
    {
        "port",
        "connect_timeout",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
    }
)


def _libpq_value_problem(name: str, value: str) -> str | None:
    """Why libpq would refuse ``value`` for parameter ``name`` when it connects, or None."""
    choices = _LIBPQ_CHOICES.get(name)
    if choices is not None and value not in choices:
        return f"{name}={value!r} is not one of {', '.join(choices)}"
    parts = value.split(",") if name == "port" else [value]
    if name in _LIBPQ_INTEGERS and not all(p.strip().isdigit() for p in parts if p):
        return f"{name}={value!r} is not a whole number"
    return None


def _password_refused(shown: str) -> InputError:
    """A secret in a postgresql:// URI (as ``user:pass@`` or a ``LIBPQ_SECRET_PARAMS``
    parameter) would reach logs and Prefect's parameters."""
    return InputError(
        f"sink {shown}: a password in the URI is not accepted; set "
        "PGPASSWORD (or use ~/.pgpass) and leave it out of the URI"
    )


def _check_libpq_params(query: str, shown: str) -> None:
    """Refuse, before anything is sent or connected, a query parameter libpq would refuse
    only at connect time (after the run had embedded and committed): a name it does not
    know (``tabel``), a value it would not take (``sslmode=requre``, ``port=abc``:
    ``_libpq_value_problem``), or a secret, which belongs in PGPASSWORD or ~/.pgpass."""
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in LIBPQ_SECRET_PARAMS:
            raise _password_refused(shown)
        if name not in _LIBPQ_PARAMS:
            raise InputError(
                f"sink {shown}: unknown query parameter {name!r}; the query takes libpq's "
                "connection parameters (host, port, sslmode, ...) and embedline's "
                "table=NAME, joined by '&'"
            )
        problem = _libpq_value_problem(name, value)
        if problem is not None:
            raise InputError(f"sink {shown}: {problem} (libpq's connection parameters)")


def _pgvector_open(params: dict[str, str]) -> VectorSink:
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError:
        raise FatalError(
            "the pgvector sink needs psycopg and pgvector: pip install 'embedline[pgvector]'"
        ) from None
    from adapters.sinks.pgvector import PgVectorSink

    return PgVectorSink(params["dsn"], table=params["table"])


# --- Qdrant ----------------------------------------------------------------------------

_COLLECTION_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def _collection_name(name: str, shown: str) -> str:
    if not _COLLECTION_RE.match(name):
        raise InputError(
            f"sink {shown}: collection name {name!r} must be letters, digits, _ and - (at most 255)"
        )
    return name


def _qdrant_claims(scheme: str, text: str) -> bool:
    return scheme in ("qdrant", "qdrant+https", "qdrant+local")


def _qdrant_parse(text: str, scheme: str, shown: str) -> dict[str, str]:
    rest = text[len(scheme) + 3 :]
    if scheme == "qdrant+local":
        path, mark, query = rest.rpartition("?")
        if not mark:
            path, query = query, ""
        if not path:
            raise InputError(f"sink {shown}: no directory; {_forms()}")
        pairs = parse_qsl(query, keep_blank_values=True)
        names = [v for k, v in pairs if k == "collection"]
        if len(names) > 1 or len(pairs) > len(names):
            raise InputError(
                f"sink {shown}: only ?collection=NAME (once) is accepted after the "
                "path (a path holding '?' needs ?collection=NAME after it); "
                f"{_forms()}"
            )
        collection = _collection_name(names[0] if names else DEFAULT_TABLE, shown)
        path = _a_directory(os.path.abspath(path), shown)
        return {
            "path": path,
            "collection": collection,
            "identity": f"qdrant+local://{path}?collection={collection}",
        }
    parts = urlsplit(text)
    if "@" in parts.netloc:
        raise InputError(
            f"sink {shown}: credentials in the URI are not accepted; set "
            "QDRANT_API_KEY and leave them out of the URI"
        )
    collection = parts.path.strip("/")
    if not parts.hostname or not collection or parts.query or parts.fragment:
        raise InputError(f"sink {shown}: expected {scheme}://HOST[:PORT]/COLLECTION; {_forms()}")
    try:
        port = parts.port or 6333
    except ValueError:
        raise InputError(f"sink {shown}: the port is not a number") from None
    http = "https" if scheme == "qdrant+https" else "http"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    collection = _collection_name(collection, shown)
    return {
        "url": f"{http}://{host}:{port}",
        "collection": collection,
        "identity": f"{scheme}://{host}:{port}/{collection}",
    }


def _qdrant_open(params: dict[str, str]) -> VectorSink:
    try:
        import qdrant_client  # noqa: F401
    except ImportError:
        raise FatalError(
            "the Qdrant sink needs qdrant-client: pip install 'embedline[qdrant]'"
        ) from None
    from adapters.sinks.qdrant import QdrantSink

    return QdrantSink(
        collection=params["collection"],
        url=params.get("url"),
        path=params.get("path"),
        identity=params["identity"],
    )


def _pgvector_retable(params: dict[str, str], table: str) -> dict[str, str]:
    return {**params, "table": _table_name(table, table)}


def _pgvector_alias(params: dict[str, str], alias: str, via: VectorSink | None) -> AliasSwitch:
    from adapters.sinks.aliases import PgAlias

    del via  # a connection of its own: the switch is one transaction
    if not _TABLE_RE.match(alias):
        raise InputError(
            f"--alias {alias!r}: a PostgreSQL alias is a view name: letters, "
            "digits and _ (at most 63, not starting with a digit)"
        )
    return PgAlias(params["dsn"], alias)


def _qdrant_retable(params: dict[str, str], collection: str) -> dict[str, str]:
    collection = _collection_name(collection, collection)
    head = params["identity"].rsplit("collection=" if "path" in params else "/", 1)[0]
    joiner = "collection=" if "path" in params else "/"
    return {**params, "collection": collection, "identity": f"{head}{joiner}{collection}"}


def _qdrant_alias(params: dict[str, str], alias: str, via: VectorSink | None) -> AliasSwitch:
    from adapters.sinks.aliases import QdrantAlias

    # a local-mode directory admits one client per process: reuse the loader's
    return QdrantAlias(via or _qdrant_open(_qdrant_retable(params, alias)), alias)


#: The stores, tried in order; the first whose ``claims`` is true parses the URI.
KINDS: tuple[SinkKind, ...] = (
    SinkKind(
        "lancedb",
        ("lancedb://PATH[?table=NAME]", "PATH/NAME.lance"),
        _lancedb_claims,
        _lancedb_parse,
        _lancedb_open,
    ),
    SinkKind(
        "pgvector",
        ("postgresql://user@host:port/db[?table=NAME]",),
        _pgvector_claims,
        _pgvector_parse,
        _pgvector_open,
        _pgvector_retable,
        _pgvector_alias,
    ),
    SinkKind(
        "qdrant",
        ("qdrant://HOST:PORT/COLLECTION", "qdrant+local://PATH[?collection=NAME]"),
        _qdrant_claims,
        _qdrant_parse,
        _qdrant_open,
        _qdrant_retable,
        _qdrant_alias,
    ),
)


def _forms() -> str:
    return "accepted forms: " + ", ".join(form for kind in KINDS for form in kind.forms)


def _parse(uri: str) -> tuple[SinkKind, dict[str, str]]:
    """The store ``uri`` names and its opener's arguments.

    :raises InputError: see ``validate_sink_uri``.
    """
    text = (uri or "").strip()
    if not text:
        raise InputError(f"--sink is empty; {_forms()}")
    scheme = scheme_of(text)
    shown = redact(text)
    for kind in KINDS:
        if kind.claims(scheme, text):
            return kind, kind.parse(text, scheme, shown)
    raise InputError(f"unsupported sink {shown}; {_forms()}")


def is_sink_uri(uri: str) -> bool:
    """Whether ``uri`` names a sink (some store claims it), valid or not; an output root
    (a directory, ``s3://``) is not one."""
    text = (uri or "").strip()
    scheme = scheme_of(text)
    return any(kind.claims(scheme, text) for kind in KINDS)


def validate_sink_uri(uri: str) -> str:
    """Return ``uri`` if it names a sink embedline can open; never connects.

    :raises InputError: unknown form, a password in the URI, a bad table name.
    """
    _parse(uri)
    return uri


def server_refusal(uri: str) -> Exception | None:
    """One connect to a sink on a PostgreSQL server, before a run pays for anything: the
    refusal a rerun would meet again as a ``FatalError`` (no such database or role, a
    password, ``pg_hba.conf`` or a connection parameter refused: ``pg_errors.translate``),
    the error of a server that does not answer now (not fatal: it may answer by the load,
    and a rerun loads what a run could not; the CLI warns), or None when it answers or the
    store is not one (a local store opens at the load).

    :raises InputError: see ``validate_sink_uri``.
    """
    kind, params = _parse(uri)
    if kind.name != "pgvector":
        return None
    try:
        import psycopg
    except ImportError:
        return None  # the load's open names the missing package
    from adapters.sinks.pg_errors import translate

    try:
        psycopg.connect(params["dsn"], connect_timeout=_CHECK_CONNECT_S).close()
    except psycopg.Error as exc:
        return translate(exc, f"PostgreSQL {redact(uri)}")
    return None


_CHECK_CONNECT_S = 5  # seconds: libpq's connect_timeout for server_refusal


def open_sink(uri: str) -> VectorSink:
    """Open the sink named by ``uri`` (connects lazily, on first use).

    :raises InputError: see ``validate_sink_uri``.
    :raises FatalError: the sink's client library is not installed.
    """
    kind, params = _parse(uri)
    return kind.open(params)


def sink_uri_for_table(uri: str, table: str) -> str:
    """The URI of table (collection) ``table`` in the store ``uri`` names: the table a
    cutover loads into (``tasks.load.cutover.alias_table``).

    :raises InputError: see ``validate_sink_uri``; the store has no aliases (LanceDB).
    """
    kind, params = _aliasing(uri)
    assert kind.retable is not None
    return kind.open(kind.retable(params, table)).identity


def open_alias(uri: str, alias: str, *, via: VectorSink | None = None) -> AliasSwitch:
    """The alias switch for name ``alias`` in the store ``uri`` names; ``via``, an open
    sink of that store (the table just loaded), lends its client where the store needs
    one client per process (Qdrant's local mode).

    :raises InputError: see ``validate_sink_uri``; the store has no aliases (LanceDB).
    """
    kind, params = _aliasing(uri)
    assert kind.alias is not None
    return kind.alias(params, alias, via)


def _aliasing(uri: str) -> tuple[SinkKind, dict[str, str]]:
    kind, params = _parse(uri)
    if kind.alias is None:
        raise InputError(
            f"{kind.name} has no aliases or views, so --alias cannot switch "
            "readers in one step: load each model into a table of its own "
            "(?table=NAME) and point the application at it, or use pgvector or "
            "Qdrant"
        )
    return kind, params


def loaded_identity(uri: str, sink: VectorSink) -> str:
    """The identity of the table ``uri`` (opened as ``sink``) reads: the table the alias of
    that name points at now, when it is one (a cutover's view or collection alias), else the
    sink's own. Loads are recorded under the table's identity (the ledger's
    ``last_loaded_run``), so this is how a search finds the run that made the vectors it
    reads, whichever name it was given. A store without aliases (LanceDB): the sink's own.
    """
    kind, params = _parse(uri)
    if kind.alias is None or kind.retable is None:
        return sink.identity
    try:
        switch = kind.alias(params, sink.table_name, sink)
    except InputError:  # a table name that cannot be an alias name: a table
        return sink.identity
    try:
        current = switch.state().current
    finally:
        if getattr(switch, "sink", None) is not sink:  # Qdrant's lends the sink's client
            switch.close()
    if current is None or current == sink.table_name:
        return sink.identity
    return kind.open(kind.retable(params, current)).identity
