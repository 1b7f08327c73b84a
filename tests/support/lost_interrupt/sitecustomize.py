"""Test-only (put this directory first on PYTHONPATH): a SIGINT that Python loses.

Right after the CLI spawns its temporary server, a ``__del__`` raises SIGINT and runs on, so
the handler's ``KeyboardInterrupt`` is raised inside ``__del__``, where Python prints
"Exception ignored in" and drops it. A real Ctrl-C did the same when it landed in importlib's
module-lock weakref callback while the CLI planned (about 1 in 500 in the first 50 ms).
"""

import signal


class _LosesAnInterrupt:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the handler runs at a backward jump, still in __del__
            pass


def _lose_an_interrupt_after_the_server_spawns() -> None:
    import cli.local_server

    start = cli.local_server.LocalServer.start

    def start_then_lose_an_interrupt(self):  # type: ignore[no-untyped-def]
        started = start(self)
        _LosesAnInterrupt()  # dropped at once: __del__ runs here
        return started

    cli.local_server.LocalServer.start = start_then_lose_an_interrupt  # type: ignore[method-assign]


_lose_an_interrupt_after_the_server_spawns()
