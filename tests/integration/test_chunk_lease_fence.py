"""A chunk lease fences every request its holder sends, retries included.

A copy of a chunk cut off from the network mid-request (tests/integration/
test_cluster_partition.py does it with network namespaces) sees its request time out and
its lease renewals fail; Dask meanwhile runs the chunk elsewhere and that copy takes the
lapsed lease. When the network returns, the first copy's retry must not go out: the check
made before the request was recorded is minutes old by then. Here the same, in one process:
the real ``OpenAIEmbedder`` against the fake server (its first answer later than the
client's timeout), wrapped as a leased chunk task wraps it, and a second copy that takes the
lease while the first waits to retry.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapters.embeddings import OpenAIEmbedder
from adapters.object_store import LocalDirStore
from embedline.keys import request_key
from tasks.embed.spent import SpendRecords, drain_spent, spending
from tasks.lease.chunk_lease import ChunkLeaseLost, take_chunk_lease
from tests.support.fake_openai import FakeEmbeddingServer

pytestmark = pytest.mark.integration

RUN = "c" * 64
TEXTS = ["first text", "second text"]


def test_a_retry_after_the_lease_went_to_another_copy_is_not_sent(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    first = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=0.3)
    assert first is not None
    first._stop.set()  # its renewals fail from now on (the store is out of reach)
    taken = []

    def backoff(seconds: float) -> None:  # the retry waits; meanwhile another copy takes over
        time.sleep(2.5)  # past TTL + slack (2 s) by the store's clock
        second = take_chunk_lease(store, RUN, "c1", published=lambda: False, ttl_s=30)
        assert second is not None
        taken.append(second)

    records = SpendRecords(store, RUN, "c1", check=first.check)
    with FakeEmbeddingServer() as server:
        server.script([{"delay_s": 1.5}])  # answered after the client gave up on it
        embedder = OpenAIEmbedder(
            base_url=server.base_url,
            model="text-embedding-3-small",
            dimensions=None,
            api_key="sk-test",
            timeout_s=0.5,
            max_attempts=3,
            sleep=backoff,
        )
        client = spending(embedder, records)  # as a leased chunk task does
        with pytest.raises(ChunkLeaseLost):
            client.embed(TEXTS, idempotency_key=request_key(["a", "b"]))
        records.flush()
        time.sleep(1.2)  # the first request's late answer lands, nothing follows it
        assert server.requests == 1  # the retry was not sent
        embedder.close()
    assert len(taken) == 1
    usage = drain_spent(store, RUN)
    assert (usage.requests, usage.requests_retried) == (1, 1)  # the one that timed out
    taken[0].release()
    first.release()
