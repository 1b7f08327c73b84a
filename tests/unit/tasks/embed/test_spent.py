"""Spend records: written as each request goes out, corrected after it, summed and removed
by the flow; a lease that lapsed to another copy stops the request before it is recorded,
and a request that never went out (waiting for its slot) is not counted."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.object_store import LocalDirStore
from embedline.errors import RetryableError
from tasks.embed.paid import PAID_PREFIX
from tasks.embed.spent import SpendRecords, drain_spent, spending
from tasks.lease.chunk_lease import ChunkLeaseLost

RUN = "b" * 64


class _Unsent(Exception):
    """Raised by ``_Client`` before its request goes out: it waited for its concurrency
    slot when its process was stopped."""


class _Client:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.model = "m"

    def embed(self, texts: list[str], **kwargs: Any) -> Any:
        if not isinstance(self.answers[0], _Unsent):  # as the HTTP client: slot, fence, send
            kwargs["before_send"]()
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_requests_answered_failed_and_in_flight_are_counted_from_the_store(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    failure = RetryableError("503 past its retries")
    failure.requests, failure.inputs = 3, 9  # type: ignore[attr-defined]
    answers = [SimpleNamespace(requests=2, tokens=40, inputs=6), failure]
    records = SpendRecords(store, RUN, "c1")
    client = spending(_Client(answers), records)
    client.embed(["a", "b", "c"])  # answered on its second attempt
    with pytest.raises(RetryableError):
        client.embed(["d", "e", "f"])  # no vectors
    records.flush()
    dead = SpendRecords(store, RUN, "c2")  # a worker killed mid-request
    dead.sending(4)
    usage = drain_spent(store, RUN)
    # requests: 2 + 3 + 1; inputs charged: 3 + 4 (the request in flight); tokens: 40
    assert (usage.requests, usage.inputs, usage.tokens) == (6, 7, 40)
    assert (usage.requests_retried, usage.inputs_retried) == (4, 12)
    assert [i.key for i in store.list(PAID_PREFIX)] == []
    assert drain_spent(store, RUN).requests == 0


def test_a_lost_lease_stops_the_request_before_it_is_sent_or_counted(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)

    def lost() -> None:
        raise ChunkLeaseLost("another copy took it")

    client = _Client([SimpleNamespace(requests=1, tokens=1, inputs=1)])
    with pytest.raises(ChunkLeaseLost):
        spending(client, SpendRecords(store, RUN, "c1", check=lost)).embed(["a"])
    assert client.answers and drain_spent(store, RUN).requests == 0


def test_a_request_that_never_left_its_slot_wait_is_not_counted(tmp_path: Path) -> None:
    """A worker killed while a request waited for its concurrency slot (one thread per worker
    does, at ``--nthreads`` = ``--concurrency`` + 1) counted it as sent and charged: the
    summary said 20 inputs more than the server charged."""
    store = LocalDirStore(tmp_path)
    client = spending(_Client([_Unsent("stopped while waiting")]), SpendRecords(store, RUN, "c1"))
    with pytest.raises(_Unsent):
        client.embed(["a", "b"])
    usage = drain_spent(store, RUN)
    assert (usage.requests, usage.inputs) == (0, 0)
