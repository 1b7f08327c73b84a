"""``embedline run`` plans a local input in a child process while it imports Prefect.

The CLI must plan before it knows whether it needs Prefect at all (a committed run, or one
with nothing to embed, ends without it), and it must import Prefect before the flow: both
are single-threaded Python (0.45 s and 0.8 s of CPU for the English file), so in one
process they add up before the first request. A child process plans on another core
while this one imports, and hands the plan back.

The child writes into a scratch directory this process created and holds (its lock, its
deletion at exit: ``adapters.scratch``); the request and the result travel as two pickle
files in it, never on a command line (column names and paths stay out of ``ps``). The
child has a session of its own (a terminal's Ctrl-C reaches only the CLI, which stops it)
and is killed with the CLI (``PR_SET_PDEATHSIG``; ``close``). Anything unexpected — the
child cannot start, dies, or returns nothing readable — and the CLI plans in-process
instead, so every input error reads exactly as planning words it.

Nothing runs ahead for a rerun that may need no Prefect at all (``prefect_on_demand``: a
night whose every chunk may be copied from earlier objects): planning then stays in-process
and Prefect starts only once a flow is needed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.lifeline import set_parent_death_signal

if TYPE_CHECKING:  # imported when used: the child sets its parent-death signal first
    from adapters.scratch import Scratch
    from embedline.models import InputPlan
    from embedline.settings import RunSettings

__all__ = ["PlanAhead", "prefect_on_demand"]

_REQUEST = "plan-ahead.request"
_RESULT = "plan-ahead.result"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # holds cli/, adapters/, …


def prefect_on_demand(settings: RunSettings) -> bool:
    """Whether ``settings``' run may end before Prefect with every chunk copied from earlier
    objects (``flows.copied_run``), asked before anything starts: its settings allow it, its
    input is a local file and its ledger already indexes objects of its output. The CLI
    then starts nothing ahead (the temporary server, a planning child, the flow's import:
    3.1, 0.4 and 0.4 CPU s of a 1M-row night of copied rows, about 12 s in all)
    and starts Prefect once a flow is needed."""
    import sqlite3

    from adapters.ledger import Ledger
    from adapters.object_store import open_store
    from embedline.errors import EmbedlineError

    if (
        not settings.copies_in_process
        or "://" in settings.input
        or not os.path.isfile(settings.ledger)
    ):
        return False
    try:
        uri = open_store(settings.output).uri
        ledger = Ledger(settings.ledger)
    except (EmbedlineError, OSError, sqlite3.Error):
        return False  # the run reports it with its full context
    try:
        return ledger.indexes_output(uri)
    except sqlite3.Error:
        return False
    finally:
        ledger.close()


class PlanAhead:
    """The planning child of one ``run``. ``start(settings)`` (None if it cannot start),
    then ``plan(settings)`` once (blocks until the child is done), ``close()`` always."""

    def __init__(self, scratch: Scratch, proc: subprocess.Popen[bytes]) -> None:
        self.scratch, self.proc = scratch, proc
        self._handed = False  # the plan (and with it the scratch directory) went to the run

    @classmethod
    def for_run(cls, settings: RunSettings) -> PlanAhead | None:
        """``start`` for a local input run against a configured Prefect server; None
        otherwise. The temporary server's start-up hides the import already, and a third
        busy process on two cores slowed all three (a nothing-to-embed rerun 1.2 -> 2.2 s)."""
        from cli.prefect_env import configured_api_url

        if not _same_file_in_a_child(settings.input) or not configured_api_url():
            return None
        return cls.start(settings)

    @classmethod
    def start(cls, settings: RunSettings) -> PlanAhead | None:
        """Start planning ``settings.input`` (a local file) in a child process."""
        from adapters.scratch import Scratch
        from embedline.errors import EmbedlineError

        try:
            scratch = Scratch.create(settings.scratch_root)
        except (OSError, EmbedlineError):
            return None  # planning in-process reports it with its full context
        arguments = {k: v for k, v in settings.plan_arguments.items() if k != "scratch_root"}
        try:
            (scratch.path / _REQUEST).write_bytes(
                pickle.dumps({"input": settings.input, "arguments": arguments})
            )
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(
                    p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p
                ),
                # planning does no linear algebra; numpy's OpenBLAS threads, started at
                # import, spin about 0.1 CPU s for nothing (measured: 0.19 -> 0.06 s)
                "OPENBLAS_NUM_THREADS": "1",
            }
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.plan_ahead", str(scratch.path), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        except OSError:
            scratch.close()
            return None
        return cls(scratch, proc)

    def plan(self, settings: RunSettings) -> InputPlan:
        """The child's plan of ``settings.input`` (its ``scratch`` is this object's
        directory, released with the run's plan), or the plan made here if the child
        failed unexpectedly.

        :raises InputError: (and any ``EmbedlineError``) as ``plan_csv`` raises it.
        """
        from adapters.csv_source import plan_csv

        result = self._result()
        if result is None:
            self.scratch.close()
            return plan_csv(settings.input, **settings.plan_arguments)
        kind, value = result
        if kind == "error":
            self.scratch.close()
            raise value
        self._handed = True
        return value  # type: ignore[no-any-return]  # the plan: kind is not "error"

    def close(self) -> None:
        """Stop the child if it still runs (an interrupt, an error before ``plan``) and
        delete the scratch directory unless its plan went to the run."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        if not self._handed:
            self.scratch.close()

    def _result(self) -> tuple[str, Any] | None:
        from embedline.errors import EmbedlineError
        from embedline.models import InputPlan

        if self.proc.wait() != 0:
            return None
        try:
            result = pickle.loads((self.scratch.path / _RESULT).read_bytes())
            (self.scratch.path / _RESULT).unlink()
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            return None
        if not (
            isinstance(result, tuple)
            and len(result) == 2
            and (
                (result[0] == "plan" and isinstance(result[1], InputPlan))
                or (result[0] == "error" and isinstance(result[1], EmbedlineError))
            )
        ):
            return None
        return result


def _same_file_in_a_child(path: str) -> bool:
    """Whether a child process opening ``path`` reads what this process would: a local
    regular file reached without ``/dev/`` or ``/proc/`` (``/dev/stdin``, ``/dev/fd/3``
    and their links name this process's descriptors, which the child does not have)."""
    if "://" in path:
        return False
    hop = path
    for _ in range(40):  # the kernel's own limit on a symlink chain
        if os.path.abspath(hop).startswith(("/dev/", "/proc/")):
            return False
        if not os.path.islink(hop):
            return os.path.isfile(hop)
        hop = os.path.join(os.path.dirname(hop), os.readlink(hop))
    return False


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses ``import pandas`` in the planning child. pyarrow imports pandas at its first
    ``pa.array`` to check whether the input is a pandas object (``pandas-shim.pxi``), and
    takes an ImportError as "no pandas": planning never hands it one, and the import is
    0.2 CPU s of a child that runs on every ``run`` (a twentieth of a 1M-row plan)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by the planning child", name=fullname)


def _child(scratch_dir: str) -> int:
    """The child: plan what the request file asks into ``scratch_dir``; write the result."""
    sys.meta_path.insert(0, _NoPandas())
    from adapters.csv_source import plan_csv
    from adapters.scratch import Scratch
    from embedline.errors import EmbedlineError

    directory = Path(scratch_dir)
    request = pickle.loads((directory / _REQUEST).read_bytes())
    try:
        result: tuple[str, Any] = (
            "plan",
            plan_csv(request["input"], **request["arguments"], scratch=Scratch.lent(directory)),
        )
    except EmbedlineError as exc:
        result = ("error", exc)
    written = directory / f".{_RESULT}"
    written.write_bytes(pickle.dumps(result))
    written.rename(directory / _RESULT)
    return 0


if __name__ == "__main__":
    set_parent_death_signal(int(sys.argv[2]))  # before the imports of a plan (0.3 s)
    sys.exit(_child(sys.argv[1]))
