"""Run embedline's flows in the test process, on the session's Prefect server.

A CLI subprocess pays its imports (Prefect, pandas, the adapters) on every call: 2-3 s on a
quiet machine, 9 s on a loaded one, against 0.3-2 s for the same flow called here, where the
worker imported them once. Use these where a test needs a run published or loaded as a
*precondition*, or checks what the run did (its summary, the sink, the output), not what the
``embedline`` process printed or how it exited: those stay with ``run_cli``.

Without ``api_url`` Prefect would start a temporary server of its own in the test process
(10 s and more): pass the session server's (fixture ``prefect_api_url``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_in_process", "run_in_process"]


def _summary(flow: Any, api_url: str, params: dict[str, Any]) -> dict[str, Any]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        state = flow(**params, return_state=True)
    result = state.result(raise_on_failure=False)
    return dict(getattr(result, "summary", result))  # a failed run's data is an exception


def run_in_process(api_url: str, *, expect: int | None = 0, **params: Any) -> dict[str, Any]:
    """Run the ``embed-csv`` flow (``embedline run``'s) with ``params``; return its summary.

    :param expect: the exit code the summary must carry (None: any).
    """
    from embedline.parameters import grouped
    from flows.embed_csv import embed_csv

    summary = _summary(embed_csv, api_url, grouped(params))
    assert expect is None or summary["exit_code"] == expect, summary
    return summary


def load_in_process(api_url: str, *, expect: int | None = 0, **params: Any) -> dict[str, Any]:
    """Run the ``load-run`` flow (``embedline load``'s) with ``params``; return its summary.

    :param expect: the exit code the summary must carry (None: any).
    """
    from flows.load import load_run

    summary = _summary(load_run, api_url, params)
    assert expect is None or summary["exit_code"] == expect, summary
    return summary
