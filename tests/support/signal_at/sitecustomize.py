"""Test-only (put this directory first on PYTHONPATH): the process signals itself at a chosen
point, to hit a window a few milliseconds wide every time.

``EMBEDLINE_TEST_SIGNALS`` holds ``;``-separated ``WHEN:MODULE:ATTRIBUTE:SIGNAL`` entries:
``after:tasks.commit.commit_run:write_manifest:SIGKILL`` sends SIGKILL right after the manifest's
PUT returns; ``before:cli.local_server:LocalServer.stop:SIGINT`` sends SIGINT as the temporary
server's stop begins; ``SIGKILL@1234`` sends it to process group 1234 instead of this
process. Each entry fires once, at the first call; ``WHEN:MODULE:ATTRIBUTE:SIGNAL:N`` at
the N-th (``before:tasks.lease.held:drop_lease:SIGINT:2``: the second lease released). A signal with
a Python handler is raised by
``signal.raise_signal``, so the handler runs at once in the main thread, as a real one would.
"""

import importlib
import os
import signal


def _send(name: str) -> None:
    name, _, group = name.partition("@")
    signum = getattr(signal, name)
    if group:  # SIGNAL@PGID: another process group (a server the test started), not this one
        os.killpg(int(group), signum)
        return
    if signum == signal.SIGKILL:
        os.kill(os.getpid(), signum)
    signal.raise_signal(signum)


def _wrap(when: str, module_name: str, attribute: str, signame: str, nth: str = "1") -> None:
    owner = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    calls = []

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(True)
        if when == "before" and len(calls) == int(nth):
            _send(signame)
        result = original(*args, **kwargs)
        if when == "after" and len(calls) == int(nth):
            _send(signame)
        return result

    setattr(owner, name, wrapper)


for _entry in filter(None, os.environ.get("EMBEDLINE_TEST_SIGNALS", "").split(";")):
    _wrap(*_entry.split(":"))
