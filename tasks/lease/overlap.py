"""Overlapping runs on one output: a later run waits for an earlier live one, then copies what
it published instead of paying for it again (docs/reference/output-layout.md, "Overlapping
runs"). A rule of the store alone: Prefect takes no part, so it holds for the CLI, a
deployment's flow run and any mix of them.

- A run takes its lease first (``tasks.lease.run_lease``), then lists the run leases of its
  output (``earlier_runs``).
- Another lease *overlaps* when it is live (not ``lease_stale`` by the store's clock, and
  its holder is not a process of this host that is gone: ``holder`` in its body), belongs
  to another holder (another run key, or the same run key held by another process: another
  key stem ``{run_key}.{owner}``) and may send vectors this run could copy: the same
  ``model`` and requested ``dimensions`` (what the reuse index matches on; a lease that
  does not say overlaps).
- Of two overlapping leases the *earlier* is the one first written earlier by the store's
  clock (``held_since``: its LastModified less one renewal period per generation), then
  the smaller key stem: a total order, so of runs starting together exactly one goes on and
  none waits for a run that waits for it.
- A run that finds an earlier overlapping lease waits (``wait_for_earlier_runs``), holding
  its own lease (a third run queues behind both), until none is left: committed, stopped,
  or stale. Then it looks for its work, so its reuse stage indexes what the earlier run
  published and copies it. When the bound passes first, the caller steps aside.

Two leases whose writes cross (each listed before the other's write is visible, the later
write stamped earlier) both go on; a lease write takes milliseconds, so that window is
that small.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from embedline.errors import EmbedlineError
from embedline.protocols import ObjectStore
from tasks.lease.held import LEASE_PREFIX, LEASE_RENEW_S, holder_gone, lease_stale

__all__ = [
    "WAIT_POLL_S",
    "WAIT_SAY_EVERY_S",
    "RunLease",
    "Waited",
    "earlier_runs",
    "lease_stem",
    "span_text",
    "wait_for_earlier_runs",
]

#: How often a waiting run lists the leases again (seconds).
WAIT_POLL_S = 5.0
#: How often a waiting run says again what it waits for (seconds).
WAIT_SAY_EVERY_S = 60.0

Log = Any  # logging.Logger, a LoggerAdapter or Prefect's run logger: ``.info``


@dataclass(frozen=True, slots=True)
class RunLease:
    """The newest generation of one holder's run lease: ``stem`` (``…/{run_key}.{owner}``),
    ``key``, ``modified`` (store's clock, Unix s), its body ``record`` and ``held_since``
    (store's clock, Unix s: when its holder first wrote it)."""

    stem: str
    key: str
    modified: float
    record: dict[str, Any]
    held_since: float

    @property
    def run_key(self) -> str:
        """The holder's run key ("" when the body has none)."""
        return str(self.record.get("run_key") or "")

    def order(self) -> tuple[float, str]:
        """Its place among overlapping leases: earlier first (module docstring)."""
        return self.held_since, self.stem


@dataclass(frozen=True, slots=True)
class Waited:
    """What ``wait_for_earlier_runs`` did: whether it ``waited`` at all, and the earlier
    runs still live when its bound passed (``left``, earliest first; empty: go on)."""

    waited: bool
    left: tuple[RunLease, ...] = ()


def lease_stem(key: str) -> str:
    """A lease key without its generation: ``…/{run_key}.{owner}`` (one holder)."""
    return key.rsplit(".", 2)[0]


def _generation(key: str) -> int:
    try:
        return int(key.rsplit(".", 2)[1])
    except (IndexError, ValueError):
        return 0


def _read(store: ObjectStore, key: str, modified: float) -> RunLease | None:
    """The lease at ``key`` (None if it is gone or is not a lease body)."""
    try:
        record = json.loads(store.get(key))
    except FileNotFoundError:
        return None
    except ValueError:
        record = {}
    if not isinstance(record, dict):
        record = {}
    try:
        renew_s = float(record.get("renew_s") or LEASE_RENEW_S)
    except (TypeError, ValueError):
        renew_s = LEASE_RENEW_S
    since = modified - _generation(key) * renew_s
    return RunLease(lease_stem(key), key, modified, record, since)


def _may_send_ours(record: dict[str, Any], model: str, dimensions: int | None) -> bool:
    """Whether the lease's run may send vectors this run could copy (module docstring)."""
    if "model" not in record:
        return True
    return (record.get("model"), record.get("dimensions")) == (model, dimensions)


def earlier_runs(
    store: ObjectStore, own_key: str, *, model: str, dimensions: int | None
) -> list[RunLease]:
    """The live run leases of ``store`` that overlap the lease ``own_key`` (a run embedding
    with ``model`` at requested ``dimensions``) and come before it, earliest first (module
    docstring). One listing, one read per lease.

    :raises EmbedlineError: the store cannot be listed or read.
    """
    newest: dict[str, tuple[str, float]] = {}
    for info in store.list(LEASE_PREFIX):
        if not info.key.endswith(".json"):
            continue
        stem = lease_stem(info.key)
        if stem not in newest or _generation(info.key) > _generation(newest[stem][0]):
            newest[stem] = (info.key, info.modified)
    own_stem = lease_stem(own_key)
    leases = [_read(store, key, modified) for key, modified in newest.values()]
    own = next((lease for lease in leases if lease and lease.stem == own_stem), None)
    now = store.server_now()
    place = own.order() if own is not None else (now, own_stem)
    return sorted(
        (
            lease
            for lease in leases
            if lease is not None
            and lease.stem != own_stem
            and lease.order() < place
            and _may_send_ours(lease.record, model, dimensions)
            and not lease_stale(lease.modified, lease.record, now)
            and not holder_gone(lease.record)
        ),
        key=RunLease.order,
    )


def span_text(seconds: float) -> str:
    """A duration for a progress line: ``45 s``, ``12 min``, ``3 h 5 min``."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def _said(lease: RunLease, own_run_key: str, now: float) -> str:
    """Which run a lease is, for a progress line: run key prefix, started when (store's
    clock). Never a host or the owner tag."""
    started = datetime.fromtimestamp(lease.held_since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    who = (
        f"another process of this run {lease.run_key[:12]}"
        if lease.run_key == own_run_key
        else f"run {lease.run_key[:12] or '(unnamed)'}"
    )
    ago = span_text(now - lease.held_since)
    return f"{who}, started {started} ({ago} ago by the store's clock)"


def wait_for_earlier_runs(
    store: ObjectStore,
    own_key: str,
    *,
    run_key: str,
    model: str,
    dimensions: int | None,
    bound_s: float,
    log: Log,
    poll_s: float = WAIT_POLL_S,
    say_every_s: float = WAIT_SAY_EVERY_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Waited:
    """Wait, at most ``bound_s`` seconds, until no run lease overlapping the lease
    ``own_key`` (of run ``run_key``, embedding with ``model`` at ``dimensions``) comes before
    it (``earlier_runs``), listing every ``poll_s`` seconds and saying on ``log`` which runs
    it waits for at once and every ``say_every_s`` seconds (``Waited``).

    :raises EmbedlineError: the store cannot be listed or read.
    """
    started = clock()
    earlier = earlier_runs(store, own_key, model=model, dimensions=dimensions)
    if not earlier:
        return Waited(False)
    said = started
    _say(log, earlier, run_key, store, bound_s, waited_s=0.0)
    while earlier:
        waited = clock() - started
        if waited >= bound_s:
            return Waited(True, tuple(earlier))
        sleep(min(poll_s, bound_s - waited))
        try:
            earlier = earlier_runs(store, own_key, model=model, dimensions=dimensions)
        except EmbedlineError as exc:  # a store hiccup: keep waiting, within the bound
            log.warning("could not list the runs of this output: %s", exc)
            continue
        if earlier and clock() - said >= say_every_s:
            said = clock()
            _say(log, earlier, run_key, store, bound_s, waited_s=clock() - started)
    log.info("no earlier run on this output is running now: looking for what it published")
    return Waited(True)


def _say(
    log: Log,
    earlier: list[RunLease],
    run_key: str,
    store: ObjectStore,
    bound_s: float,
    *,
    waited_s: float,
) -> None:
    now = store.server_now()
    log.info(
        "waiting for %s on this output, which may be embedding texts this run would copy: "
        "%s waited, at most %s (--wait-for-live-run)%s",
        _said(earlier[0], run_key, now),
        span_text(waited_s),
        span_text(bound_s),
        f"; {len(earlier) - 1} more earlier run(s) after it" if len(earlier) > 1 else "",
    )
