"""What a PostgreSQL refusal means for a load (docs/reference/sinks.md): one row, the table, or the
server.

psycopg's exception classes follow the DB-API, not the cause: ``ProgramLimitExceeded`` ("index
row requires 12016 bytes, maximum size is 8191") is an ``OperationalError`` like a lost
connection. So refusals are classified by SQLSTATE (PostgreSQL manual, Appendix A "PostgreSQL
Error Codes"), most specific first:

- **row**: class 22 (data exception: ``22021`` invalid byte sequence, e.g. a NUL; ``22001``
  value too long; ``22P05`` untranslatable character; ``22P02`` invalid vector text), ``54000``
  (program limit exceeded: an index row or row too big), ``23514`` (a CHECK constraint). The
  row can never be loaded into this table as it is: a load dead letter, the chunk goes on.
- **table**: class 42 (undefined column, datatype mismatch, no unique index for ``ON
  CONFLICT``…) and the other class 23 violations (a NOT NULL column embedline does not write,
  another unique index): the table is not of embedline's shape; exit 3, no rerun advice.
- **retry**: no SQLSTATE (the client lost or never got its connection) or classes 08
  (connection), 40 (serialization failure, deadlock), 53 (insufficient resources, disk full),
  55 (lock not available), 57 (operator intervention, query canceled), 58 (system I/O).
  ``57014`` (query canceled) is named as such: a timeout the server or a pooler enforces
  (``statement_timeout``, ``query_timeout``) or an operator's cancel, not a server down.
- **fatal**: anything else (a refusal a rerun would meet again), and a connection the server
  refused at startup for good: libpq gives those no SQLSTATE, only the server's ``FATAL:``
  message (``3D000`` database, ``28000`` role or ``pg_hba.conf``, ``28P01`` password,
  ``42501`` ``CONNECT`` privilege), matched in the server's default English wording
  (``_REFUSED_AT_STARTUP``); other wordings stay *retry*.

Messages use the server's primary message only: its DETAIL may quote the row's values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from embedline.errors import FatalError, RetryableError

__all__ = [
    "REASONS",
    "Refusal",
    "classify",
    "describe_columns_sql",
    "one_line",
    "relkind_sql",
    "row_reason",
    "shape_problems",
    "translate",
    "unique_id_sql",
]

Refusal = Literal["row", "table", "retry", "fatal"]

#: SQLSTATE → the load dead letter's reason word (a row refused for good).
REASONS = {
    "54000": "id_too_long",  # "index row requires N bytes, maximum size is 8191"
    "22021": "invalid_byte_sequence",  # "invalid byte sequence for encoding "UTF8": 0x00"
    "22001": "value_too_long",  # "value too long for type character varying(20)"
    "22P05": "untranslatable",  # a character the database's encoding cannot hold
    "23514": "check_violation",
}
_RETRY_CLASSES = ("08", "40", "53", "55", "57", "58")
#: A server's startup refusals that a rerun meets again (PostgreSQL's src/backend messages):
#: a ``FATAL:`` at connect such as "too many clients" or "starting up" passes in a while.
_REFUSED_AT_STARTUP = re.compile(
    r"FATAL:\s+(database \".*\" does not exist|role \".*\" does not exist"
    r"|password authentication failed|no pg_hba\.conf entry|permission denied for database)"
)
#: libpq's own refusals of a connection parameter's value (``invalid sslmode value``,
#: ``invalid integer value "abc" for connection option "port"``): the URI is wrong.
_BAD_PARAMETER = re.compile(r"(invalid [a-z_]+ value.*|invalid connection option.*)")


def classify(exc: BaseException) -> Refusal:
    """Return what ``exc`` (a ``psycopg.Error``) refuses: one row, the table, nothing yet
    (retry), or the load (fatal)."""
    state = getattr(exc, "sqlstate", None)
    if state is None:
        return "fatal" if _refused_at_startup(exc) or _bad_parameter(exc) else "retry"
    if state.startswith("22") or state in ("54000", "23514"):
        return "row"
    if state.startswith(("42", "23")) and state != "42501":
        return "table"
    if state.startswith(_RETRY_CLASSES):
        return "retry"
    return "fatal"


def _refused_at_startup(exc: BaseException) -> str:
    """The server's ``FATAL:`` message if ``exc`` is a connection it refused for good (a
    database or role that does not exist, a password or ``pg_hba.conf`` refusal), else "".
    """
    text = str(exc)
    found = _REFUSED_AT_STARTUP.search(text)
    return text[found.start(1) :].splitlines()[0].strip() if found else ""


def _bad_parameter(exc: BaseException) -> str:
    """libpq's refusal of a connection parameter's value in ``exc``, else ""."""
    found = _BAD_PARAMETER.search(str(exc))
    return found.group(1).splitlines()[0].strip() if found else ""


def row_reason(exc: BaseException) -> str:
    """The dead letter's reason word for a row-kind refusal."""
    state = str(getattr(exc, "sqlstate", "") or "")
    return REASONS.get(state, "invalid_value")


def one_line(exc: BaseException) -> str:
    """The server's primary message (never its DETAIL, which may quote values), one line."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = str(primary or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate(exc: Exception, where: str) -> Exception:
    """Map a psycopg error to embedline's classes (adapter edge, most specific first)."""
    import psycopg

    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        # the primary message names the object ("permission denied for table T"), not values
        return FatalError(
            f"{where}: {exc.__class__.__name__}: {one_line(exc)}: grant the user these "
            "rights (docs/reference/sinks.md lists what each stage needs)"
        )
    if isinstance(exc, psycopg.errors.InvalidPassword):
        return FatalError(f"{where}: {exc.__class__.__name__}: check the user and PGPASSWORD")
    if isinstance(exc, psycopg.errors.UndefinedFile):
        return FatalError(
            f"{where}: the pgvector extension is not available on this server "
            f"({exc.__class__.__name__}); install pgvector"
        )
    bad = _bad_parameter(exc)
    if bad:
        return FatalError(f"{where}: libpq refused a connection parameter ({bad}): fix the URI")
    refused = _refused_at_startup(exc)
    if refused:
        return FatalError(
            f"{where}: the server refused the connection ({refused}): check the database "
            "name, the user and PGPASSWORD the URI uses"
        )
    kind = classify(exc)
    state = getattr(exc, "sqlstate", None)
    if kind == "retry":
        advice = (
            "free space on the database server"
            if str(state).startswith("53")
            else _CANCELLED
            if state == "57014"
            else "check that the server is running"
        )
        return RetryableError(f"{where}: {one_line(exc)}; {advice}")
    if kind == "table":
        return FatalError(
            f"{where}: the table is not of embedline's shape ({state}: "
            f"{one_line(exc)}); load into another table (?table=NAME) or fix "
            "that one"
        )
    if not isinstance(exc, psycopg.DatabaseError):
        return exc  # a client-side misuse: a bug, reported as such
    return FatalError(f"{where}: PostgreSQL refused it ({state}: {one_line(exc)})")


#: 57014 query_canceled: the server stopped the statement, it did not fail.
_CANCELLED = (
    "the server cancelled the statement (57014): a timeout it enforces — the role's or "
    "database's statement_timeout (ALTER ROLE … SET statement_timeout = 0), or a pooler's "
    "query_timeout — or someone cancelled it; lift the timeout for this role"
)

_TEXT_TYPES = ("text", "character varying")
_MIN_KEY_LENGTH = 80  # run keys (64 hex + a generation suffix) and SHA-256 hex (64)


def _texty(type_name: str, *, min_length: int | None) -> bool:
    if type_name in _TEXT_TYPES:
        return True
    if type_name.startswith("character varying(") and min_length is not None:
        return int(type_name[len("character varying(") : -1]) >= min_length
    return False


def shape_problems(
    columns: Sequence[tuple[str, str, bool, bool]],
    *,
    has_unique_id: bool,
    kind: str,
    dimensions: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """What differs between an existing table and embedline's shape, one phrase each.

    ``columns``: ``(name, format_type, NOT NULL, has a default)`` per column; ``kind``: its
    ``pg_class.relkind``. ``id`` may be ``varchar(n)`` (longer ids become dead letters).
    ``extra``: the text columns the table's metadata says it keeps (``kept_sha256``, kept
    columns, ``text``), each required to exist as text.
    """
    if kind not in ("r", "p"):
        return [f"it is not a table (relkind {kind!r})"]
    found = {name: (type_name, notnull, default) for name, type_name, notnull, default in columns}
    want = {
        "id": None,
        "embedding": None,
        "text_sha256": _MIN_KEY_LENGTH,
        "run_key": _MIN_KEY_LENGTH,
    }
    problems = [f"no column {name}" for name in want if name not in found]
    if "id" in found and not _texty(found["id"][0], min_length=1):
        problems.append(f"id is {found['id'][0]}, not text")
    for name in ("text_sha256", "run_key"):
        if name in found and not _texty(found[name][0], min_length=want[name]):
            problems.append(f"{name} is {found[name][0]}, not text")
    for name in extra:
        if name not in found:
            problems.append(f"no column {name}")
        elif not _texty(found[name][0], min_length=_MIN_KEY_LENGTH if name == "kept_sha256" else 1):
            problems.append(f"{name} is {found[name][0]}, not text")
    if "embedding" in found and not found["embedding"][0].startswith("vector("):
        problems.append(f"embedding is {found['embedding'][0]}, not vector({dimensions})")
    if not has_unique_id and "id" in found:
        problems.append("no primary key (or unique index) on id alone")
    problems += [
        f"column {name} is NOT NULL without a default (embedline does not write it)"
        for name, (_, notnull, default) in found.items()
        if name not in want and name not in extra and notnull and not default
    ]
    return problems


def describe_columns_sql() -> str:
    """The catalog query behind ``shape_problems`` (one parameter: the quoted table name)."""
    return """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                     a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> ''
              FROM pg_attribute a
              WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
              ORDER BY a.attnum"""


def unique_id_sql() -> str:
    """Whether a unique, non-partial index covers exactly ``id`` (what ``ON CONFLICT (id)``
    needs); one parameter: the quoted table name."""
    return """SELECT EXISTS (
                SELECT 1 FROM pg_index i
                JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indnkeyatts = 1
                  AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = 'id')"""


def relkind_sql() -> str:
    """The table's ``relkind`` (``r`` table, ``p`` partitioned, ``v`` view…)."""
    return "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)"
