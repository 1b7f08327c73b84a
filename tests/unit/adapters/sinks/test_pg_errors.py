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
