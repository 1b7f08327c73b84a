"""Test-only (put this directory first on PYTHONPATH of a process run under libfaketime with
``FAKETIME_DONT_FAKE_MONOTONIC=1``): ``time.sleep`` waits in ``select`` instead.

libfaketime 0.9.10 (Debian's) rewrites the absolute deadline of
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which CPython's ``time.sleep`` uses, as
if it were a wall-clock time, and the call fails with ``EINVAL`` ("Invalid argument") however
the clock is shifted; ``select``, ``Event.wait`` and lock timeouts take relative timeouts and
are untouched. The process's own code runs unchanged: only the way it sleeps differs.

Then runs the next ``sitecustomize`` on the path (``tests/support/signal_at``), if any.
"""

import os
import runpy
import select
import sys
import time
from typing import SupportsIndex


def _sleep(seconds: "float | SupportsIndex") -> None:
    """``time.sleep`` on the monotonic clock through ``select`` (signals interrupt it as
    they interrupt ``time.sleep``: a handler's exception propagates, PEP 475 resumes)."""
    if float(seconds) < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + float(seconds)
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _other = os.path.join(_entry, "sitecustomize.py")
    if _entry and os.path.abspath(_entry) != _here and os.path.isfile(_other):
        runpy.run_path(_other, run_name="sitecustomize_next")
        break
