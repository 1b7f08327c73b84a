"""What ``embedline run`` prepared for a run before Prefect started, handed to the flow it
runs in the same process and thread: one ``Session``, set for the flow's call (``handing``)
and read by the flow (``current``), checked by run key and plan arguments.

It holds:

- the input plan (the flow plans the same file about a second later: taking it skips that
  second pass, 0.4 s of CPU for 27 MB); valid for the same plan arguments, and only while
  the local file's size, mtime and inode are those seen when it was made (chunk reads verify
  their bytes against the plan either way);
- the reuse stage prepared for the run's chunks left (``flows.copied_run``), so no row is
  planned or copied twice;
- the run recorded ``running``, its hard-exit hook (a hard exit before the flow has run
  marks it ``interrupted``) and its lease, held until the flow has run, so gc keeps what
  the run needs with no gap (the flow takes no second lease).

A ``contextvars.ContextVar``, not a process global: the flow's parameters stay plain
values, and a flow run outside the command (a deployment) finds no session. Prefect-free.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapters.scratch import release
from embedline.models import InputPlan
from embedline.shutdown import STOP

if TYPE_CHECKING:
    from embedline.settings import RunSettings
    from tasks.reuse.stage import ReuseStage

__all__ = ["Session", "current", "handing"]

FileStamp = tuple[int, int, int, int]  # size (bytes), mtime (ns), inode, device


@dataclass(slots=True)
class Session:
    """What the CLI prepared for run ``run_key`` of ``settings``: its ``plan`` (with the
    input file's ``stamp`` then), the reuse ``stage`` prepared for chunks ``stage_chunks``
    (indexes), the run's ``lease`` (released by ``close``) and ``hard_exit_hook``
    (registered with ``STOP.exit``; dropped by ``flow_has_run``)."""

    settings: RunSettings
    plan: InputPlan | None = None
    stamp: FileStamp | None = None
    run_key: str | None = None
    stage: ReuseStage | None = None
    stage_chunks: tuple[int, ...] = ()
    lease: contextlib.ExitStack | None = None
    hard_exit_hook: Callable[[], None] | None = None
    _plan_taken: bool = field(default=False, repr=False)

    @classmethod
    def for_plan(cls, settings: RunSettings, plan: InputPlan) -> Session:
        """A session handing over ``plan`` of ``settings`` (the input file stamped now)."""
        return cls(settings, plan, _local_file_stamp(settings.input))

    def take_plan(self, settings: RunSettings) -> InputPlan | None:
        """The handed plan, once, if ``settings`` plan the same input with the same
        arguments and the local file has not changed since; else None."""
        plan, self.plan = self.plan, None
        if plan is None:
            return None
        if self.stamp is None:
            release(plan.scratch)
            return None
        same = (settings.input, settings.plan_arguments) == (
            self.settings.input,
            self.settings.plan_arguments,
        )
        if same and _local_file_stamp(settings.input) == self.stamp:
            return plan
        release(plan.scratch)
        return None

    def take_stage(self, run_key: str, chunks: tuple[int, ...]) -> ReuseStage | None:
        """The prepared reuse stage, now the caller's, if it was prepared for this run and
        these chunks (indexes); else None (a stage for another run or chunks is closed)."""
        stage, self.stage = self.stage, None
        if stage is None:
            return None
        if (run_key, chunks) != (self.run_key, self.stage_chunks):
            stage.close()
            return None
        return stage

    def holds_lease(self, run_key: str) -> bool:
        """Whether the session holds run ``run_key``'s lease (the flow takes no second)."""
        return self.lease is not None and self.run_key == run_key

    def take_lease(self) -> contextlib.ExitStack:
        """The run's lease, now the caller's to release (``holds_lease`` was true)."""
        lease, self.lease = self.lease, None
        assert lease is not None, "take_lease() without a lease"
        return lease

    def flow_has_run(self) -> None:
        """The flow has run and recorded the run's end itself: drop the hard-exit hook."""
        hook, self.hard_exit_hook = self.hard_exit_hook, None
        if hook is not None:
            STOP.exit.remove_hard_exit_hook(hook)

    def close(self) -> None:
        """Release what is left: the run's lease, an untaken stage, an untaken plan's
        scratch files. The hard-exit hook stays unless the flow has run: an interrupt
        before it marks the run ``interrupted`` (``cli.main``)."""
        plan, self.plan = self.plan, None
        if plan is not None:
            release(plan.scratch)
        stage, self.stage = self.stage, None
        if stage is not None:
            stage.close()
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.close()


_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "embedline_session", default=None
)


def current() -> Session | None:
    """The session the command set for the flow it runs now, if any."""
    return _current.get()


@contextlib.contextmanager
def handing(session: Session) -> Iterator[Session]:
    """Make ``session`` the current one for the block (the flow's call), then close it."""
    token = _current.set(session)
    try:
        yield session
    finally:
        _current.reset(token)
        session.close()


def _local_file_stamp(path: str | os.PathLike[str]) -> FileStamp | None:
    path = os.fspath(path)
    if "://" in path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev
