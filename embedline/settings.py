"""Run settings: one validated, frozen pydantic model shared by the CLI and the flow.

Settings never hold secrets: the API key is read from the environment by the adapter that
needs it (``EMBEDLINE_API_KEY``, else ``OPENAI_API_KEY``), so it never becomes a Prefect
parameter or a ledger value.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError, field_validator, model_validator

from embedline.http_names import is_field_name
from embedline.run_fields import RunFields
from embedline.template import (
    RESERVED_COLUMNS,
    TEXT_COLUMN,
    TemplateError,
    parse_template,
)

__all__ = [
    "BATCH_API_OPTIONS",
    "DASK_OPTIONS",
    "DEFAULT_MODELS",
    "LOCAL_CLUSTER_CLASSES",
    "LOCAL_DIMENSIONS",
    "LOCAL_MODEL_NAMES",
    "MODE_OPTIONS",
    "NO_API_KEY_MESSAGE",
    "PARAMETER_FIELDS",
    "RunSettings",
    "codec_for",
    "dask_cluster_problem",
    "option_description",
    "options_without_their_mode",
    "remote_dask",
    "validation_message",
]

#: Model used when ``--model`` is not given, per embedder.
DEFAULT_MODELS = {
    "local": "sentence-transformers/all-MiniLM-L6-v2",
    "openai": "text-embedding-3-small",
}

#: The embedded local model (all-MiniLM-L6-v2) and its vector length.
LOCAL_MODEL_NAMES = frozenset({DEFAULT_MODELS["local"], "all-MiniLM-L6-v2"})
LOCAL_DIMENSIONS = 384

#: Hosts that refuse every request without a key (OpenAI API reference, "Authentication").
KEY_REQUIRED_HOSTS = frozenset({"api.openai.com"})
NO_API_KEY_MESSAGE = (
    "--base-url is OpenAI's API, which refuses requests without a key: "
    "export EMBEDLINE_API_KEY (or OPENAI_API_KEY)"
)

#: CLI flag / flow parameter name → settings field, where the field name carries its unit.
PARAMETER_FIELDS = {
    "timeout": "timeout_s",
    "chunk_retry_delay": "chunk_retry_delay_s",
    "grace": "grace_s",
    "wait_for_live_run": "wait_for_live_run_s",
    "batch_poll_interval": "batch_poll_interval_s",
}

#: Options (CLI flags and flow parameters, by parameter name) only the Batch API mode reads.
BATCH_API_OPTIONS = (
    "batch_poll_interval",
    "batch_max_inputs",
    "batch_fallback",
    "batch_enqueued_tokens",
)
#: Options only a Dask run reads (``dask_workers``: only a local cluster's).
DASK_OPTIONS = ("dask_address", "dask_cluster_class", "dask_cluster_kwargs", "dask_workers")

#: Each option only one mode reads → (the parameter that turns its mode on, its value then,
#: the CLI's words for it). Unset is None in the flow's signature and absent from the CLI's
#: namespace; given without their mode they are refused (``options_without_their_mode``),
#: never ignored.
MODE_OPTIONS: Mapping[str, tuple[str, object, str]] = MappingProxyType(
    {
        **dict.fromkeys(BATCH_API_OPTIONS, ("batch_api", True, "--batch-api")),
        **dict.fromkeys(DASK_OPTIONS, ("task_runner", "dask", "--task-runner dask")),
    }
)


def options_without_their_mode(
    parameters: Mapping[str, object],
) -> list[tuple[str, str, object, str]]:
    """The ``MODE_OPTIONS`` given (not None) in ``parameters`` (CLI or flow parameter names)
    although their mode is off, each as (option, mode parameter, its value that turns the
    mode on, the CLI's words for that): each would be ignored, so the caller refuses the run
    (exit 2), naming the first."""
    return [
        (name, mode, on, words)
        for name, (mode, on, words) in MODE_OPTIONS.items()
        if parameters.get(name) is not None and parameters.get(mode) != on
    ]


def option_description(name: str) -> str:
    """The description of run option ``name`` (CLI or flow parameter name) as ``embedline run
    --help`` and the flow's form show it: its field's, and for an option only one mode
    reads, which both leave unset unless given, its default in words ("(default: 60.0)")."""
    info = RunFields.model_fields[PARAMETER_FIELDS.get(name, name)]
    text = info.description or ""
    if name in MODE_OPTIONS and info.default is not None:
        return f"{text} (default: {info.default})"
    return text


def _embedder_problem(settings: RunSettings) -> str | None:
    """Why ``settings`` ask the embedder for what it does not do, or None."""
    local = settings.embedder == "local"
    if local and settings.model is not None and settings.model not in LOCAL_MODEL_NAMES:
        return (
            f"the local embedder runs {DEFAULT_MODELS['local']} only; use "
            f"--embedder openai for {settings.model!r}"
        )
    if local and settings.dimensions not in (None, LOCAL_DIMENSIONS):
        return (
            f"the local model gives {LOCAL_DIMENSIONS} dimensions; omit "
            "--dimensions or use --embedder openai"
        )
    if local and settings.max_input_tokens is not None:
        return (
            "--max-input-tokens is a limit of an OpenAI-compatible server (--embedder "
            "openai); the local model truncates every text to its 256 word pieces itself: "
            "omit --max-input-tokens"
        )
    if settings.on_too_long == "truncate" and settings.max_input_tokens is None:
        return (
            "--on-too-long truncate needs --max-input-tokens N (the model's limit per text, "
            "e.g. 8191 for text-embedding-3): texts are cut to 3 x N UTF-8 bytes"
        )
    if settings.batch_api and settings.embedder != "openai":
        return (
            "--batch-api needs --embedder openai (OpenAI's Batch API, or a "
            "server with the same /files and /batches endpoints)"
        )
    return None


def codec_for(encoding: str) -> str:
    """Return the Python codec name for ``--encoding``, or ``"auto"`` (UTF-8 with or without
    BOM, UTF-16 by its BOM, else detected: ``adapters.csv_format.sniff_format``).

    UTF-16 (``utf-16`` with a BOM, ``utf-16-le``, ``utf-16-be``) is read line by line on its
    2-byte units; other codecs must encode the newline as the byte 0x0A.

    :raises ValueError: for an unknown codec, or one a line reader cannot split (UTF-32).
    """
    if encoding.lower() == "auto":
        return "auto"
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(
            f"unknown encoding {encoding!r}; use 'auto' (UTF-8, UTF-16 by BOM, else detected) "
            "or a Python codec name such as 'cp932', 'latin-1'"
        ) from None
    if name == "utf-8-sig":
        return "utf-8"
    if name in ("utf-16", "utf-16-le", "utf-16-be"):
        return name
    if "\n".encode(name) != b"\n":
        raise ValueError(f"encoding {encoding!r} is not supported: re-encode the file as UTF-8")
    return name


#: pydantic's range errors, worded as the CLI's own argument types word them.
_BOUNDS = {
    "less_than_equal": ("must be at most", "le"),
    "greater_than_equal": ("must be at least", "ge"),
    "greater_than": ("must be greater than", "gt"),
    "less_than": ("must be less than", "lt"),
}


#: ``module.Class`` (dotted Python identifiers): ``--dask-cluster-class``.
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")

#: Cluster classes whose workers run on this machine (the output may be a local directory).
LOCAL_CLUSTER_CLASSES = frozenset(
    {
        "distributed.LocalCluster",
        "distributed.deploy.local.LocalCluster",
        "dask.distributed.LocalCluster",
    }
)

#: Keys of ``--dask-cluster-kwargs`` that name a secret (refused: parameters are stored).
_SECRET_KEY = re.compile(r"password|passwd|secret|token|api_?key|credential|private_?key", re.I)


def dask_cluster_problem(settings: RunFields) -> str | None:
    """Why the Dask cluster options of ``settings`` cannot make one cluster, or None: a
    cluster named without the dask runner, both an address and a class, kwargs without a
    class, a class that is not an import path, a secret in the kwargs (parameters are
    stored), or workers on other machines with a local output."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("dask_address", "dask_cluster_class", "dask_cluster_kwargs")
        if getattr(settings, name) is not None
    ]
    if given and settings.task_runner != "dask":
        return f"{given[0]} needs --task-runner dask"
    if settings.dask_address and settings.dask_cluster_class:
        return (
            "give one Dask cluster: --dask-address (a running scheduler) or "
            "--dask-cluster-class (a cluster the run starts), not both"
        )
    if (settings.dask_address or settings.dask_cluster_class) and (
        "dask_workers" in settings.model_fields_set
    ):
        option = "--dask-address" if settings.dask_address else "--dask-cluster-class"
        return (
            f"--dask-workers sizes the local cluster: the cluster of {option} has its own "
            "workers (drop --dask-workers)"
        )
    kwargs, cluster_class = settings.dask_cluster_kwargs, settings.dask_cluster_class
    if kwargs is not None and not cluster_class:
        return "--dask-cluster-kwargs needs --dask-cluster-class"
    if cluster_class is not None and not _IMPORT_PATH.fullmatch(cluster_class):
        return (
            f"--dask-cluster-class: {cluster_class!r} is not an import path of a class "
            "(module.Class, e.g. dask_kubernetes.operator.KubeCluster)"
        )
    secret = _secret_key(kwargs) if kwargs is not None else None
    if secret is not None:
        return (
            f"--dask-cluster-kwargs: {secret!r} looks like a secret, which would be stored in "
            "the flow run's parameters: set it in the environment the cluster class reads instead"
        )
    if settings.task_runner == "dask" and "://" not in settings.output and remote_dask(settings):
        option = "--dask-address" if settings.dask_address else "--dask-cluster-class"
        return (
            f"with {option} the chunk tasks run on other machines, which cannot "
            f"write to the local directory {settings.output!r}: use an s3:// --output"
        )
    return None


def remote_dask(settings: RunFields) -> bool:
    """Whether the run's chunk tasks run on other machines: a Dask cluster by address, or
    started from a cluster class other than distributed's ``LocalCluster``."""
    cluster_class = settings.dask_cluster_class
    return bool(settings.dask_address) or (
        cluster_class is not None and cluster_class not in LOCAL_CLUSTER_CLASSES
    )


def _secret_key(value: object) -> str | None:
    """The first name of a secret given a literal value in a JSON value (nested objects and
    lists included): a key that names a secret with a string or number under it, or a
    Kubernetes ``{"name": NAME, "value": …}`` pair whose NAME does; None if there is none. A
    secret named with an object under it (``secretKeyRef``: a reference) is not a value."""
    if isinstance(value, dict):
        name = value.get("name")
        if isinstance(name, str) and "value" in value and _SECRET_KEY.search(name):
            return name
        for key, item in value.items():
            if isinstance(item, (str, int, float)) and _SECRET_KEY.search(str(key)):
                return str(key)
            found = _secret_key(item)
            if found is not None:
                return found
    elif isinstance(value, list):
        for item in value:
            found = _secret_key(item)
            if found is not None:
                return found
    return None


def validation_message(exc: ValidationError) -> str:
    """One line for a pydantic error: ``--flag: problem; …`` (without pydantic's "Value
    error, " prefix, which says nothing to a user); a range error reads ``must be at most
    2048, got 2049``, as the CLI's argument types say it."""
    flags = {field: name for name, field in PARAMETER_FIELDS.items()}  # grace_s → --grace
    return "; ".join(
        (
            f"--{flags.get(str(e['loc'][0]), str(e['loc'][0])).replace('_', '-')}: "
            if e["loc"]
            else ""
        )
        + _problem(e)
        for e in exc.errors()
    )


def _problem(error: Any) -> str:
    bound = _BOUNDS.get(error["type"])
    if bound is not None and bound[1] in error.get("ctx", {}):
        return f"{bound[0]} {error['ctx'][bound[1]]}, got {error['input']}"
    if error["type"] == "finite_number":
        return f"must be a finite number, got {error['input']}"
    return str(error["msg"]).removeprefix("Value error, ")


class RunSettings(RunFields):
    """Everything a run needs but secrets: the fields of ``RunFields`` (types, defaults, bounds,
    help), the rules between them, and the values derived from them."""

    @model_validator(mode="before")
    @classmethod
    def _one_placeholder_is_the_text_column(cls, data: Any) -> Any:
        """``--text-template '{X}'`` is ``--text-column X`` (one run key for one meaning)."""
        if isinstance(data, dict) and isinstance(data.get("text_template"), str):
            if data.get("text_column") not in (None, "text"):
                raise ValueError(
                    "pass --text-template or --text-column, not both: the "
                    "template names the columns of the text"
                )
            try:
                single = parse_template(data["text_template"]).single_column
            except TemplateError:
                return data  # the field validator says what is wrong
            if single is not None:
                data = {**data, "text_template": None, "text_column": single}
        return data

    @field_validator("text_template")
    @classmethod
    def _template_parses(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parse_template(value)
        except TemplateError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("keep_columns", mode="before")
    @classmethod
    def _column_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [name.strip() for name in value.split(",")]
        if value is None:
            return None
        names = list(value)
        if any(not isinstance(n, str) or not n for n in names):
            raise ValueError(
                "an empty column name (write the names separated by commas: title,section)"
            )
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"column {twice[0]!r} is named twice")
        reserved = [n for n in names if n in RESERVED_COLUMNS]
        if reserved:
            raise ValueError(
                f"column {reserved[0]!r} cannot be kept under its name: "
                f"{', '.join(RESERVED_COLUMNS)} are embedline's own columns "
                "(rename it in the CSV)"
            )
        return tuple(names) or None

    @model_validator(mode="after")
    def _text_column_is_free(self) -> RunSettings:
        if self.keep_text and TEXT_COLUMN in (self.keep_columns or ()):
            raise ValueError(
                f"--keep-text writes the text as column {TEXT_COLUMN!r}, which "
                "--keep-columns also names: drop it from --keep-columns (the "
                "text is kept either way) or rename the CSV column"
            )
        return self

    @model_validator(mode="after")
    def _embedder_options_fit(self) -> RunSettings:
        """What the chosen embedder takes: the local model's name and length, the Batch API,
        and the too-long policy (``_embedder_problem``)."""
        problem = _embedder_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _max_cost_is_checkable(self) -> RunSettings:
        """``max_cost`` is checked where each synchronous request is sent, per process:
        refused where it could not hold (no price, no paid request, batches, Dask)."""
        if self.max_cost is None:
            return self
        if self.price_per_million_tokens is None:
            raise ValueError("--max-cost needs --price-per-million-tokens (USD per 1M tokens)")
        if self.embedder != "openai":
            raise ValueError("--max-cost needs --embedder openai (the local model costs nothing)")
        if self.batch_api:
            raise ValueError(
                "--max-cost caps synchronous requests, not Batch API batches: drop one of "
                "--max-cost, --batch-api (--dry-run shows the cost first)"
            )
        if self.task_runner == "dask":
            raise ValueError(
                "--max-cost is checked in this process, not in Dask workers: drop one of "
                "--max-cost, --task-runner dask"
            )
        return self

    @model_validator(mode="after")
    def _one_usable_dask_cluster(self) -> RunSettings:
        problem = dask_cluster_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        codec_for(value)
        return value

    @field_validator("sink")
    @classmethod
    def _sink_has_no_password(cls, value: str | None) -> str | None:
        if value and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:[^/@]+@", value):
            instead = "QDRANT_API_KEY" if value.lower().startswith("qdrant") else "PGPASSWORD"
            raise ValueError(
                "a password in the sink URI is not accepted (it would be stored "
                f"in Prefect parameters and the ledger): set {instead} instead"
            )
        return value or None

    @field_validator("auth_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is not None and not is_field_name(value):
            raise ValueError(f"{value!r} is not an HTTP header name (RFC 9110 §5.1)")
        return value

    @field_validator("delimiter")
    @classmethod
    def _one_character(cls, value: str) -> str:
        value = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";"}.get(value, value)
        if value != "auto" and (len(value) != 1 or value in '\r\n"'):
            raise ValueError("--delimiter is auto or one character (',', ';', 'tab', '|')")
        return value

    @field_validator("id_column", "text_column")
    @classmethod
    def _column_named(cls, value: str) -> str:
        if not value:
            raise ValueError("a column name cannot be empty")
        return value

    @classmethod
    def from_parameters(cls, parameters: dict[str, object]) -> RunSettings:
        """Build settings from CLI/flow parameter names (``timeout`` → ``timeout_s`` …).

        :raises pydantic.ValidationError: a value is out of range or unknown.
        """
        fields = {
            k: v for k, v in parameters.items() if not (k in MODE_OPTIONS and v is None)
        }  # unset: the default
        for name, field in PARAMETER_FIELDS.items():
            if name in fields:
                fields[field] = fields.pop(name)
        return cls.model_validate(fields)

    def to_parameters(self) -> dict[str, object]:
        """The inverse of ``from_parameters``: flow parameters mirroring the CLI. Without
        its mode the ``MODE_OPTIONS`` are None (unset): the flow refuses them set; so is
        ``dask_workers`` with a ``dask_address`` or a ``dask_cluster_class`` (that cluster has
        its own workers)."""
        parameters = self.model_dump()
        for name, field in PARAMETER_FIELDS.items():
            parameters[name] = parameters.pop(field)
        for name, (mode, on, _) in MODE_OPTIONS.items():
            if getattr(self, mode) != on:
                parameters[name] = None
        if self.cluster_apart:
            parameters["dask_workers"] = None
        return parameters

    @property
    def cluster_apart(self) -> bool:
        """Whether the run's Dask workers were started apart from this process
        (``--dask-address``, ``--dask-cluster-class``): each has an environment of its own."""
        return bool(self.dask_address or self.dask_cluster_class)

    @property
    def request_fingerprint(self) -> str:
        """A digest of the settings that decide how a row is sent and so whether a server
        rejects it (base URL, encoding format, input-token limit and policy): a rerun whose
        fingerprint differs retries the published dead letters
        (docs/reference/output-layout.md, "Generations")."""
        fields = {
            "embedder": self.embedder,
            "base_url": self.base_url,
            "encoding_format": self.encoding_format,
            "on_too_long": self.on_too_long,
            "max_input_tokens": self.max_input_tokens,
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def effective_model(self) -> str:
        """``model``, or the embedder's default model."""
        return self.model or DEFAULT_MODELS[self.embedder]

    @property
    def requires_api_key(self) -> bool:
        """True when the embedder talks to a host that refuses requests without a key."""
        from urllib.parse import urlsplit

        return self.embedder == "openai" and urlsplit(self.base_url).hostname in KEY_REQUIRED_HOSTS

    @property
    def kept_columns(self) -> tuple[str, ...]:
        """The kept columns, in the order given (empty: none)."""
        return self.keep_columns or ()

    @property
    def truncate_bytes(self) -> int | None:
        """The UTF-8 bytes each text is cut to before it is hashed and sent (``keys.cut_text``):
        ``3 × max_input_tokens`` with ``--on-too-long truncate`` on an OpenAI-compatible
        embedder, which no script's tokens exceed (``estimate_tokens``); None: texts whole (the
        local model truncates itself)."""
        if self.on_too_long != "truncate" or self.max_input_tokens is None:
            return None
        return 3 * self.max_input_tokens if self.embedder == "openai" else None

    @property
    def codec(self) -> str:
        """The Python codec that decodes the input."""
        return codec_for(self.encoding)

    @property
    def plan_arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``adapters.csv_source.plan_csv`` for ``input`` (columns,
        codec, delimiter, quoting, chunk size in rows, model, dimensions, template, kept
        columns, normalization, truncation, ``scratch_root``)."""
        return {
            "id_column": self.id_column,
            "text_column": self.text_column,
            "codec": self.codec,
            "delimiter": self.delimiter,
            "chunk_size": self.chunk_size,
            "model": self.effective_model,
            "dimensions": self.dimensions,
            "text_template": self.text_template,
            "keep_columns": self.kept_columns,
            "keep_text": self.keep_text,
            "quoting": self.quoting,
            "normalize": self.normalize,
            "truncate_bytes": self.truncate_bytes,
            "scratch_root": self.scratch_root,
        }

    @property
    def scratch_root(self) -> str:
        """Where runs keep scratch files (``adapters.scratch``): the ledger's directory."""
        return os.path.dirname(os.path.abspath(self.ledger))

    @property
    def copies_in_process(self) -> bool:
        """Whether chunks whose every row is copied may be published by the CLI's process
        without the flow (``flows.copied_run``): reuse on, chunks run by threads, no Batch
        API, no sink to load, nothing kept beside the vectors (kept values are in the input
        only)."""
        return (
            self.reuse
            and self.task_runner == "threads"
            and not self.batch_api
            and not self.sink
            and not self.kept_columns
            and not self.keep_text
        )
