"""PostgreSQL refusals classified by SQLSTATE (adapters/sinks/pg_errors.py)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("ProgramLimitExceeded", "row"),  # "index row requires 12016 bytes": an OperationalError
        ("CharacterNotInRepertoire", "row"),
        ("StringDataRightTruncation", "row"),
        ("UntranslatableCharacter", "row"),
        ("CheckViolation", "row"),
        ("UndefinedColumn", "table"),
        ("DatatypeMismatch", "table"),
        ("NotNullViolation", "table"),
        ("InvalidColumnReference", "table"),
        ("AdminShutdown", "retry"),
        ("DiskFull", "retry"),
        ("SerializationFailure", "retry"),
        ("InsufficientPrivilege", "fatal"),
    ],
)
def test_postgresql_refusals_are_classified_by_sqlstate(error: str, kind: str) -> None:
    import psycopg

    from adapters.sinks.pg_errors import classify, translate
    from embedline.errors import FatalError, RetryableError

    exc = getattr(psycopg.errors, error)("boom")
    assert classify(exc) == kind
    if kind in ("table", "fatal"):
        assert isinstance(translate(exc, "upsert"), FatalError)
    if kind == "retry":
        assert isinstance(translate(exc, "upsert"), RetryableError)
    assert classify(psycopg.OperationalError("connection lost")) == "retry"


def test_a_statement_the_server_cancelled_names_the_timeout_not_a_server_down() -> None:
    import psycopg

    from adapters.sinks.pg_errors import translate
    from embedline.errors import RetryableError

    exc = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    got = translate(exc, "index t")
    assert isinstance(got, RetryableError) and got.exit_code == 1
    assert "57014" in str(got) and "statement_timeout" in str(got)
    assert "check that the server is running" not in str(got)
    down = translate(psycopg.errors.AdminShutdown("terminating connection"), "index t")
    assert "check that the server is running" in str(down)


@pytest.mark.parametrize(
    "fatal, kind",
    [
        ('database "nosuchdb" does not exist', "fatal"),
        ('role "nosuchrole" does not exist', "fatal"),
        ('password authentication failed for user "app"', "fatal"),
        ('no pg_hba.conf entry for host "10.0.0.2", user "app", database "db"', "fatal"),
        ('permission denied for database "db"', "fatal"),
        ("sorry, too many clients already", "retry"),
        ("the database system is starting up", "retry"),
    ],
)
def test_a_connection_refused_at_startup_is_fatal_only_when_a_rerun_meets_it_again(
    fatal: str, kind: str
) -> None:
    """libpq's startup errors carry no SQLSTATE, only the server's FATAL message."""
    import psycopg

    from adapters.sinks.pg_errors import classify, translate
    from embedline.errors import FatalError, RetryableError

    exc = psycopg.OperationalError(
        f'connection failed: connection to server on socket "/tmp/.s.PGSQL.5432" failed: '
        f"FATAL:  {fatal}"
    )
    assert classify(exc) == kind
    got = translate(exc, "PostgreSQL postgresql://app@/db")
    assert isinstance(got, FatalError if kind == "fatal" else RetryableError)
    if kind == "fatal":
        assert fatal in str(got) and "refused the connection" in str(got)


@pytest.mark.parametrize(
    "said",
    [
        'invalid sslmode value: "requre"',
        'invalid integer value "abc" for connection option "port"',
    ],
)
def test_libpqs_refusal_of_a_parameter_value_is_fatal_and_names_it(said: str) -> None:
    """A value no check caught before (a service file's, an environment variable's)."""
    import psycopg

    from adapters.sinks.pg_errors import classify, translate
    from embedline.errors import FatalError

    exc = psycopg.OperationalError(f"connection is bad: {said}")
    assert classify(exc) == "fatal"
    got = translate(exc, "PostgreSQL postgresql://app@/db")
    assert isinstance(got, FatalError) and said in str(got) and "server is running" not in str(got)
