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
