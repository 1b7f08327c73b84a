"""A group's task run (tasks/embed/task.py ``embed_chunks``, ``run_group``): each chunk run on
its own, in order; a failure kept as that chunk's outcome; the group stops before its next
chunk when the run stops; a retry runs only the chunks that failed with a retryable error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prefect.logging import disable_run_logger
from prefect.states import Failed

from embedline.errors import BadResponseError, FatalError, RetryableError, StopRequestedError
from embedline.models import ChunkOutcome, ChunkSpec
from embedline.shutdown import STOP
from tasks.embed import task as chunk_task
from tasks.embed.failures import group_retry_condition
from tasks.embed.groups import ChunkGroup, GroupOutcome


def _group(n: int) -> ChunkGroup:
    return ChunkGroup(
        tuple(ChunkSpec(i, f"{i:064x}", 1 + i, 2 + i, 1, i, i + 1, "h") for i in range(n))
    )


def _outcome(spec: ChunkSpec) -> ChunkOutcome:
    return ChunkOutcome(spec.index, spec.key, spec.object_key, "s", spec.rows)


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[int], dict[int, BaseException]]]:
    """Chunks ``run_chunk`` was called for, in order, and the errors chunks raise."""
    calls: list[int] = []
    errors: dict[int, BaseException] = {}

    def run_chunk(spec: ChunkSpec, *args: Any, **kwargs: Any) -> ChunkOutcome:
        calls.append(spec.index)
        if spec.index in errors:
            raise errors[spec.index]
        return _outcome(spec)

    monkeypatch.setattr(chunk_task, "run_chunk", run_chunk)
    STOP.dispatch.clear()
    yield calls, errors
    STOP.dispatch.clear()


def _run(group: ChunkGroup, **kw: Any) -> GroupOutcome:
    return chunk_task.run_group(
        group, None, None, (None,) * len(group.specs), None, None, logger=None, **kw
    )  # type: ignore[arg-type]


def test_a_failed_chunk_keeps_its_error_and_the_group_goes_on(ran: Any) -> None:
    calls, errors = ran
    errors[1] = BadResponseError("NaN")
    outcome = _run(_group(4))
    assert calls == [0, 1, 2, 3]
    assert [type(o).__name__ for o in outcome.outcomes] == [
        "ChunkOutcome",
        "BadResponseError",
        "ChunkOutcome",
        "ChunkOutcome",
    ]


def test_an_error_that_stops_the_run_stops_the_group_before_its_next_chunk(ran: Any) -> None:
    calls, errors = ran
    errors[1] = FatalError("401")
    outcome = _run(_group(4))
    assert calls == [0, 1]
    assert outcome.outcomes[2:] == (None, None)


def test_the_dispatcher_stop_holds_the_next_chunks(ran: Any) -> None:
    calls, _ = ran
    STOP.dispatch.hold_new_chunks()
    outcome = _run(_group(3))
    assert calls == [] and outcome.outcomes == (None, None, None)


def test_an_earlier_attempt_s_chunks_are_not_run_again(ran: Any) -> None:
    calls, _ = ran
    group = _group(3)
    earlier: dict[int, ChunkOutcome | BaseException] = {
        0: _outcome(group.specs[0]),
        2: BadResponseError("count"),
    }
    outcome = _run(group, earlier=earlier)
    assert calls == [1]
    assert outcome.outcomes[0] == earlier[0] and outcome.outcomes[2] is earlier[2]


def test_the_group_s_state_says_what_its_chunks_did(ran: Any) -> None:
    _, errors = ran
    group = _group(3)
    with disable_run_logger():
        assert isinstance(chunk_task.embed_chunks.fn(group, None, None, (None,) * 3), GroupOutcome)
        errors[1] = RetryableError("503")
        failed = chunk_task.embed_chunks.fn(group, None, None, (None,) * 3)
        assert failed.is_failed() and "1 of 3 chunks failed; chunk 1" in failed.message
        assert group_retry_condition(None, None, failed) is True
        errors[1] = StopRequestedError("stopping")
        stopped = chunk_task.embed_chunks.fn(group, None, None, (None,) * 3)
        assert stopped.is_cancelled()
        assert stopped.data.outcomes[2] is None


@pytest.mark.parametrize(
    ("errors", "retried"),
    [
        ([RetryableError("503")], True),
        ([RetryableError("503"), BadResponseError("NaN")], True),
        ([RetryableError("503"), FatalError("401")], False),
        ([BadResponseError("NaN")], False),
    ],
)
def test_a_group_is_retried_for_a_retryable_chunk_unless_the_run_stops(
    errors: list[BaseException], retried: bool
) -> None:
    state = Failed(data=GroupOutcome((*errors, None)))
    assert group_retry_condition(None, None, state) is retried
    assert group_retry_condition(None, None, Failed(data=RetryableError("503"))) is True


def test_the_group_task_pickles_for_dask_workers() -> None:
    import cloudpickle

    task = chunk_task.embed_chunks.with_options(retries=1)
    assert cloudpickle.loads(cloudpickle.dumps(task)).name == "embed-chunks"


def test_a_group_task_run_is_named_by_its_first_and_last_chunk() -> None:
    group = ChunkGroup(tuple(ChunkSpec(i, "k", 1, 2, 1, 0, 1, "h") for i in (4, 5, 11)))
    name = chunk_task.embed_chunks.task_run_name
    assert isinstance(name, str) and name.format(group=group) == "embed-chunks-0004-0011"
