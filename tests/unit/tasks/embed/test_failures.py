"""One place maps exceptions to chunk outcomes; Prefect retries only retryable chunks."""

from __future__ import annotations

import pytest
from prefect.states import Completed, Failed

from embedline.errors import (
    BadResponseError,
    ConflictError,
    FatalError,
    InputError,
    RetryableError,
    RetryLaterError,
    RowError,
    StopRequestedError,
)
from tasks.embed.failures import retry_condition, status_for


@pytest.mark.parametrize(
    ("exc", "kind", "expected"),
    [
        (FatalError("401"), "fatal", True),
        (ConflictError("other bytes"), "fatal", True),
        (InputError("changed", path="x.csv"), "input", True),
        (StopRequestedError("stopping"), "released", True),
        (RetryLaterError("wait 600 s", retry_after_s=600), "released", True),
        (RetryableError("503"), "failed", True),
        (BadResponseError("NaN"), "failed", True),
        (RowError("rejected"), "failed", True),
        (ZeroDivisionError("a bug"), "failed", False),
    ],
)
def test_status_for_each_class(exc: BaseException, kind: str, expected: bool) -> None:
    failure = status_for(exc)
    assert (failure.kind, failure.expected) == (kind, expected)
    assert type(exc).__name__ in failure.error


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (RetryableError("503"), True),
        (RetryLaterError("wait", retry_after_s=600), False),
        (FatalError("401"), False),
        (BadResponseError("count"), False),
        (ZeroDivisionError("bug"), False),
    ],
)
def test_prefect_retries_only_retryable_chunks(exc: BaseException, retried: bool) -> None:
    assert retry_condition(None, None, Failed(data=exc)) is retried


def test_completed_state_is_not_retried() -> None:
    assert retry_condition(None, None, Completed(data=1)) is False
