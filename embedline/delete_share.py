"""The mass-delete guard: a change set or a load may remove at most a share of the rows there
are (``--max-delete-fraction``), so a cut-short export or a wrong input is refused before it
deletes anything (docs/reference/output-layout.md, "Change sets"; docs/reference/sinks.md).

Checked where the removals are first known: a delta night's lookup (before anything is sent,
``tasks/plan/delta.py``), a full night's commit (``tasks/commit/commit_run.py``) and a load's
plan (``tasks/load/sink_state.py``).
"""

from __future__ import annotations

from embedline.errors import InputError

__all__ = ["DEFAULT_MAX_DELETE_FRACTION", "MassDeleteError", "check_delete_share"]

DEFAULT_MAX_DELETE_FRACTION = 0.5  # a load or a change set may remove at most half the rows


class MassDeleteError(InputError):
    """Raised when a load or a change set would delete more than ``--max-delete-fraction`` of
    the rows there are (a cut-short export, a wrong input): nothing was deleted. Exit 2."""


def check_delete_share(
    deletes: int,
    of_rows: int,
    fraction: float,
    *,
    what: str,
    kept: str = "nothing deleted",
    flag: str = "--max-delete-fraction",
) -> None:
    """Refuse ``deletes`` of ``of_rows`` rows when that is more than ``fraction`` (0..1).

    :raises MassDeleteError: naming the counts, the share and the flag that allows it.
    """
    if of_rows <= 0 or deletes <= fraction * of_rows:
        return
    share = deletes / of_rows
    allow = min(1.0, max(round(share + 0.005, 2), fraction))
    raise MassDeleteError(
        f"{what} would delete {deletes:,} of {of_rows:,} rows ({share:.0%}), more than "
        f"{flag} {fraction:g} allows: {kept}. If the input really lost those rows, "
        f"rerun with {flag} {allow:g} (deployments: parameter max_delete_fraction)"
    )
