"""The checks ``embedline run`` makes before Prefect starts, each answering in about a
second: the input, the output, the ledger, the sink URI, the API key, and a Dask cluster
given by address or class (``cli.dask_checks``). A problem is one
line and an exit code, said before any start-up cost."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from cli.failures import EXIT_FATAL, EXIT_USAGE
from cli.ledger_lookup import check_ledger

if TYPE_CHECKING:
    from embedline.settings import RunSettings

__all__ = ["check_before_prefect"]


def check_before_prefect(settings: RunSettings) -> tuple[str, int] | None:
    """Everything that can be checked in about a second, before Prefect starts: the input
    (exists, header, encoding; S3: readable with these credentials), the output (a
    directory, or a bucket these credentials reach), the API key, and the scheduler at
    ``--dask-address`` with a Prefect API its workers reach. Returns (one-line message, exit
    code) or None."""
    from adapters.csv_header import check_header
    from embedline.errors import EmbedlineError, FatalError, InputError

    if settings.task_runner == "dask" and settings.dask_address:
        from cli.dask_checks import check_dask_address
        from cli.prefect_env import configured_api_url

        problem = check_dask_address(settings.dask_address, configured_api_url())
        if problem is not None:
            return problem
    if settings.task_runner == "dask" and settings.dask_cluster_class:
        from cli.dask_checks import check_cluster_class
        from cli.prefect_env import configured_api_url

        problem = check_cluster_class(settings, configured_api_url())
        if problem is not None:
            return problem
    if "://" not in settings.input:
        if os.path.isdir(settings.input):
            return f"{settings.input} is a directory, not a CSV file", EXIT_USAGE
        if not os.path.isfile(settings.input):
            return f"{settings.input}: no such file", EXIT_USAGE
    try:
        fmt = check_header(
            settings.input,
            id_column=settings.id_column,
            text_column=settings.text_column,
            codec=settings.codec,
            text_template=settings.text_template,
            keep_columns=settings.kept_columns,
            delimiter=settings.delimiter,
            quoting=settings.quoting,
        )
        if fmt.note:
            print(
                f"embedline: reading {os.path.basename(settings.input)} as: {fmt.note}",
                file=sys.stderr,
            )
    except InputError as exc:
        return str(exc), exc.exit_code
    try:
        if settings.sink:
            from adapters.sinks import server_refusal, validate_sink_uri

            validate_sink_uri(settings.sink)
            refused = None if settings.dry_run else server_refusal(settings.sink)
            if isinstance(refused, FatalError):  # before a request is paid for: exit 3
                raise refused
            if refused is not None:  # may come back by the load: said, not refused
                print(
                    f"embedline: warning: {refused}; the run goes on, and if the sink still "
                    "does not answer at its load, rerun the same command to load it",
                    file=sys.stderr,
                )
        _check_output(settings.output)
        check_ledger(settings.ledger)
    except EmbedlineError as exc:
        return str(exc), exc.exit_code
    return _check_api_key(settings)


def _check_output(uri: str) -> None:
    """Create a local output directory, or look for a manifest in an S3 one (one HEAD):
    a file in the way, a missing bucket or missing credentials answer now.

    :raises EmbedlineError: the output is unusable (its exit code says which class).
    """
    from adapters.object_store import S3Store, open_store

    store = open_store(uri)
    store.prepare()
    if isinstance(store, S3Store):  # its prepare sends nothing: one HEAD answers now
        store.head_sha256("manifests/.embedline-check")


def _check_api_key(settings: RunSettings) -> tuple[str, int] | None:
    """OpenAI's own API with no key refuses every request (401): say so before start-up.
    With a configured Prefect server the flow decides (it may find a Secret block)."""
    from adapters.embeddings import api_key_from_env
    from embedline.settings import NO_API_KEY_MESSAGE

    if (
        settings.requires_api_key
        and api_key_from_env() is None
        and not os.environ.get("PREFECT_API_URL")
    ):
        return NO_API_KEY_MESSAGE, EXIT_FATAL
    return None
