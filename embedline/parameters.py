"""The ``embed-csv`` flow's parameters in groups, built from ``RunSettings``' own fields.

Prefect renders a pydantic-model parameter as a section of the run form; each group below is
such a model, and its fields are ``RunSettings``' fields (type, default, bounds) under their
parameter names (``timeout`` for ``timeout_s``: ``PARAMETER_FIELDS``). So a default is
declared once, in ``RunSettings``, and the flow, the CLI and a deployment read it from there.
The options only one mode reads (the Batch API's, Dask's) are ``None`` (unset) in their
group, as on the command line: set without their mode they are refused, not ignored
(``embedline.settings.options_without_their_mode``).

``grouped`` and ``flattened`` convert between the flat names of ``embedline run``'s options
(``chunk_size``) and the grouped parameters (``{"limits": {"chunk_size": …}}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from embedline.settings import (
    BATCH_API_OPTIONS,
    MODE_OPTIONS,
    PARAMETER_FIELDS,
    RunSettings,
    option_description,
)

__all__ = [
    "GROUPS",
    "BatchModeParameters",
    "DestinationParameters",
    "EmbeddingParameters",
    "LimitParameters",
    "ParameterGroup",
    "SourceParameters",
    "flattened",
    "grouped",
    "parameter_defaults",
]

#: (flow parameter, what the section holds, its fields by parameter name), in form order.
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "source",
        "Input: the CSV, its columns and how it is read.",
        (
            "input",
            "id_column",
            "text_column",
            "text_template",
            "keep_columns",
            "keep_text",
            "encoding",
            "delimiter",
            "quoting",
            "normalize",
        ),
    ),
    (
        "embedding",
        "Embedder: the model, the API and what is sent to it.",
        (
            "embedder",
            "model",
            "base_url",
            "dimensions",
            "auth_header",
            "encoding_format",
            "max_input_tokens",
            "on_too_long",
            "reuse",
            "retry_dead_letters",
        ),
    ),
    (
        "limits",
        "Limits: chunk and request sizes, pace, retries, cost and where chunks run.",
        (
            "chunk_size",
            "batch_size",
            "max_request_tokens",
            "concurrency",
            "rpm",
            "tpm",
            "timeout",
            "max_attempts",
            "chunk_retries",
            "chunk_retry_delay",
            "grace",
            "price_per_million_tokens",
            "max_cost",
            "dry_run",
            "task_runner",
            "dask_address",
            "dask_workers",
            "dask_cluster_class",
            "dask_cluster_kwargs",
        ),
    ),
    (
        "destination",
        "Output and sink: where chunks, the manifest and the ledger go, what may commit.",
        (
            "output",
            "ledger",
            "sink",
            "index",
            "max_delete_fraction",
            "wait_for_live_run",
            "compact",
            "allow_failed_rows",
            "on_empty_text",
            "allow_unconditional_store",
        ),
    ),
    (
        "batch_mode",
        "Batch mode: the openai embedder's requests as Batch API batches (half price, "
        "within 24 h).",
        ("batch_api", *BATCH_API_OPTIONS),
    ),
)


class ParameterGroup(BaseModel):
    """One section of the flow's parameters: frozen, no unknown names."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _field(name: str) -> tuple[Any, Any]:
    """``RunSettings``' field behind parameter ``name``: its type and its FieldInfo (default,
    bounds, description: the help of ``embedline run --help``); an option only one mode reads
    is ``None`` unless given, its default stated in words, as in ``--help``."""
    info = RunSettings.model_fields[PARAMETER_FIELDS.get(name, name)]
    if name not in MODE_OPTIONS:
        return info.annotation, info
    unset = Field(default=None, description=option_description(name), **_bounds(info))
    return info.annotation | None, unset  # type: ignore[operator]


def _bounds(info: Any) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    for meta in info.metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(meta, key, None) is not None:
                bounds[key] = getattr(meta, key)
        if getattr(meta, "allow_inf_nan", None) is not None:
            bounds["allow_inf_nan"] = meta.allow_inf_nan
    return bounds


def _group(
    model_name: str, parameter: str, doc: str, names: tuple[str, ...]
) -> type[ParameterGroup]:
    """A ``ParameterGroup`` named ``model_name`` of the fields ``names`` (``parameter``: the
    flow parameter it is, kept in the table ``GROUPS``)."""
    model: type[ParameterGroup] = create_model(
        model_name,
        __base__=ParameterGroup,
        __doc__=doc,
        **{name: _field(name) for name in names},  # type: ignore[call-overload]
    )
    model.__module__ = __name__
    return model


if TYPE_CHECKING:  # built at import from RunSettings; to a type checker, a ParameterGroup
    SourceParameters = ParameterGroup
    EmbeddingParameters = ParameterGroup
    LimitParameters = ParameterGroup
    DestinationParameters = ParameterGroup
    BatchModeParameters = ParameterGroup
else:
    SourceParameters = _group("SourceParameters", *GROUPS[0])
    EmbeddingParameters = _group("EmbeddingParameters", *GROUPS[1])
    LimitParameters = _group("LimitParameters", *GROUPS[2])
    DestinationParameters = _group("DestinationParameters", *GROUPS[3])
    BatchModeParameters = _group("BatchModeParameters", *GROUPS[4])


def grouped(flat: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """``{"chunk_size": 50, …}`` (run options by parameter name) as the flow's grouped
    parameters ``{"limits": {"chunk_size": 50}, …}``; groups none of ``flat`` names are left
    out (the flow's defaults).

    :raises ValueError: a name no group holds.
    """
    where = {name: group for group, _, names in GROUPS for name in names}
    unknown = sorted(set(flat) - set(where))
    if unknown:
        raise ValueError(f"not a parameter of embed-csv: {', '.join(unknown)}")
    groups: dict[str, dict[str, object]] = {}
    for group, _, names in GROUPS:
        values = {name: flat[name] for name in names if name in flat}
        if values:
            groups[group] = values
    return groups


def flattened(groups: Mapping[str, object]) -> dict[str, object]:
    """The inverse of ``grouped``: each group (a ``ParameterGroup`` or a dict) merged into one
    dict of run options by parameter name."""
    flat: dict[str, object] = {}
    for group in groups.values():
        values = group.model_dump() if isinstance(group, BaseModel) else dict(group)  # type: ignore[call-overload]
        flat.update(values)
    return flat


def parameter_defaults() -> dict[str, object]:
    """Every run option's default by parameter name (``input`` excluded: it has none); the
    options only one mode reads are None (unset)."""
    return {
        name: (None if name in MODE_OPTIONS else _field(name)[1].default)
        for _, _, names in GROUPS
        for name in names
        if name != "input"
    }
