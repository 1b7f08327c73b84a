"""A run's stop, seen by its chunk tasks on other machines (a Dask cluster).

In one process, a stopping run (Ctrl-C, SIGTERM, a cancel, a fatal chunk failure) holds new
chunks through ``STOP.dispatch`` and every group task reads it before its next chunk. A
worker of an external cluster is another process: Dask has already handed it the run's
groups, and they would go on starting chunks (and paying for them) after the command
stopped. So a run on Dask also writes its stop into the output store, the one place every
worker reaches::

    _embedline/paid/{run_key}/stops/{token}.json

``token`` is new for each dispatch (a later command resuming the run key is not stopped by an
earlier one's marker) and travels with each chunk task's parameters. A chunk task looks for
the marker (one HEAD, at most every ``POLL_S`` seconds) before each chunk it starts; chunks
already sending finish within the run's grace as in one process. The marker lies under the
run's paid requests, so ``gc`` removes it with them (``tasks/gc/retention.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass

from embedline.errors import ConflictError, EmbedlineError
from embedline.protocols import ObjectStore
from tasks.embed.paid import PAID_PREFIX

__all__ = ["POLL_S", "RunStop", "mark_run_stopped", "new_stop_key"]

#: At most one look for the marker per this many seconds, per chunk task.
POLL_S = 1.0

_log = logging.getLogger("embedline.run")


def new_stop_key(run_key: str) -> str:
    """The object key of this dispatch's stop marker (module docstring): a new token each call."""
    return f"{PAID_PREFIX}{run_key}/stops/{uuid.uuid4().hex}.json"


def mark_run_stopped(store: ObjectStore, key: str) -> None:
    """Write the stop marker ``key`` (create-only; one already there is the same stop). A store
    that refuses it is logged, never raised: the stop itself goes on in this process."""
    body = json.dumps({"stopped_at": time.time()}).encode()
    try:
        store.put_if_absent(
            key, body, sha256=hashlib.sha256(body).hexdigest(), content_type="application/json"
        )
    except ConflictError:
        pass
    except (EmbedlineError, OSError) as exc:
        _log.warning(
            "the run's stop could not be written to the output (%s): chunk tasks on other "
            "machines may start chunks until they end",
            exc,
        )


@dataclass(slots=True)
class RunStop:
    """The stop marker ``key`` as one chunk task sees it: ``stopped()`` is True once it exists
    (then for good); looked up at most every ``POLL_S`` seconds; a store error reads as not
    stopped (the run's own stop still reaches the task through its lease and grace)."""

    store: ObjectStore
    key: str
    _checked_at: float = float("-inf")  # monotonic seconds
    _stopped: bool = False

    def stopped(self) -> bool:
        if self._stopped:
            return True
        now = time.monotonic()
        if now - self._checked_at < POLL_S:
            return False
        self._checked_at = now
        try:
            self._stopped = self.store.head_sha256(self.key) is not None
        except (EmbedlineError, OSError):
            return False
        return self._stopped
