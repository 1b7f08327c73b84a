"""The dispatcher with chunk groups (flows/dispatch.py, flows/chunk_futures.py): a group is one
submission, at most ``window`` groups in flight, and each chunk of a group is recorded on its
own: published, failed, or given back when its group never started it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from prefect.states import Cancelled, Completed, Failed

from embedline.errors import BadResponseError, FatalError
from embedline.models import ChunkOutcome, ChunkSpec
from embedline.shutdown import STOP
from flows.chunk_futures import chunks_of
from flows.dispatch import Dispatcher
from tasks.embed.groups import GroupOutcome


class _Ledger:
    """What the dispatcher writes, chunk by chunk."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def published_object(self, uri: str) -> None:
        return None

    def claim(self, run_key: str, idx: int, **kw: Any) -> bool:
        self.events.append(("claim", idx))
        return True

    def release(self, run_key: str, idx: int, **kw: Any) -> None:
        self.events.append(("release", idx))

    def record_published(self, run_key: str, spec: ChunkSpec, *args: Any, **kw: Any) -> None:
        self.events.append(("published", spec.index))

    def mark_failed(self, run_key: str, idx: int, **kw: Any) -> None:
        self.events.append(("failed", idx))

    def renew(self, *args: Any, **kw: Any) -> None:
        pass


class _GroupFuture:
    """A group's task run that ends at once with ``state``."""

    def __init__(self, state: Any) -> None:
        self._future: Future[None] = Future()
        self.state = state
        self._future.set_result(None)

    def wait(self, timeout: float | None = None) -> None:
        self._future.result(timeout)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._future.add_done_callback(lambda _: fn(self))


def _specs(n: int) -> list[ChunkSpec]:
    return [ChunkSpec(i, f"{i:064x}", 1 + i, 2 + i, 1, i, i + 1, "h") for i in range(n)]


def _outcome(spec: ChunkSpec) -> ChunkOutcome:
    return ChunkOutcome(spec.index, spec.key, spec.object_key, "s", spec.rows)


def _dispatch(
    specs: list[ChunkSpec],
    groups: Callable[[Sequence[ChunkSpec]], Sequence[tuple[ChunkSpec, ...]]],
    end: Callable[[tuple[ChunkSpec, ...]], Any],
) -> tuple[Dispatcher, _Ledger, list[tuple[int, ...]]]:
    ledger = _Ledger()
    submitted: list[tuple[int, ...]] = []

    def submit(group: tuple[ChunkSpec, ...]) -> list[Any]:
        submitted.append(tuple(s.index for s in group))
        return list(chunks_of(_GroupFuture(end(group)), len(group)))

    STOP.dispatch.clear()
    dispatcher = Dispatcher(
        ledger=ledger,  # type: ignore[arg-type]
        run_key="k",
        object_uri=lambda spec: spec.object_key,
        submit=submit,
        window=2,
        logger=logging.getLogger("test"),
        group=groups,
    )
    dispatcher.run(specs)
    STOP.dispatch.clear()
    return dispatcher, ledger, submitted


def _pairs(specs: Sequence[ChunkSpec]) -> list[tuple[ChunkSpec, ...]]:
    return [tuple(specs[i : i + 2]) for i in range(0, len(specs), 2)]


def test_each_chunk_of_a_group_is_published_and_recorded_on_its_own() -> None:
    specs = _specs(6)
    dispatcher, ledger, submitted = _dispatch(
        specs, _pairs, lambda g: Completed(data=GroupOutcome(tuple(_outcome(s) for s in g)))
    )
    assert submitted == [(0, 1), (2, 3), (4, 5)]
    assert sorted(dispatcher.result.published) == [0, 1, 2, 3, 4, 5]
    assert [e for e in ledger.events if e[0] == "published"] == [("published", i) for i in range(6)]


def test_a_group_that_fails_midway_keeps_its_finished_chunks() -> None:
    specs = _specs(4)

    def end(group: tuple[ChunkSpec, ...]) -> Any:
        outcomes = [_outcome(s) for s in group]
        if group[0].index == 0:
            outcomes[1] = BadResponseError("NaN")  # type: ignore[call-overload]
        return Failed(data=GroupOutcome(tuple(outcomes)))

    dispatcher, ledger, _ = _dispatch(specs, _pairs, end)
    assert sorted(dispatcher.result.published) == [0, 2, 3]
    assert list(dispatcher.result.failed) == [1]
    assert ("failed", 1) in ledger.events


def test_chunks_a_stopped_group_never_started_are_given_back_and_not_run() -> None:
    specs = _specs(4)

    def end(group: tuple[ChunkSpec, ...]) -> Any:
        if group[0].index == 0:
            return Failed(data=GroupOutcome((_outcome(group[0]), FatalError("401"))))
        return Cancelled(data=GroupOutcome((_outcome(group[0]), None)))

    dispatcher, ledger, _ = _dispatch(specs, lambda s: [tuple(s[:2]), tuple(s[2:])], end)
    result = dispatcher.result
    assert result.stop is not None and result.stop.kind == "fatal"
    assert sorted(result.published) == [0, 2] and list(result.failed) == [1]
    assert result.not_run == [3] and ("release", 3) in ledger.events


def test_a_group_that_ended_without_saying_what_its_chunks_did_fails_them_all() -> None:
    specs = _specs(2)
    dispatcher, _, _ = _dispatch(
        specs, lambda s: [tuple(s)], lambda g: Failed(data=RuntimeError("worker lost"))
    )
    assert sorted(dispatcher.result.failed) == [0, 1]
    assert "worker lost" in dispatcher.result.failed[0].error
