"""The process-wide factory: one shared embedding client per distinct configuration, so
every chunk task of a process shares one concurrency limit, one RPM/TPM pacer, one 429
pause and one fatal latch (docs/design.md, "Layers").
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import TYPE_CHECKING

from adapters.embeddings.common import HTTP_LOGGER, Logger
from adapters.embeddings.endpoint import api_key_from_env, auth_header_for, safe_url
from adapters.embeddings.local import LocalEmbedder
from adapters.embeddings.openai_batch import BatchClient
from adapters.embeddings.openai_compatible import OpenAIEmbedder
from adapters.embeddings.spend import SpendCap
from adapters.rate_limit import Pacer
from embedline.protocols import EmbeddingClient

if TYPE_CHECKING:
    from embedline.settings import RunSettings

__all__ = ["build_batch_client", "build_embedder", "close_embedders"]

_embedders: dict[tuple[object, ...], EmbeddingClient] = {}
_embedders_lock = threading.Lock()
_warned_no_key: set[str] = set()
_batch_clients: dict[tuple[object, ...], BatchClient] = {}


def build_embedder(
    settings: RunSettings, *, logger: Logger | None = None, pacer: Pacer | None = None
) -> EmbeddingClient:
    """Return the process's shared client for ``settings``, creating it on first use.

    Cached by (embedder, model, base_url, dimensions, timeout_s, max_attempts, concurrency,
    rpm, tpm, and a digest of the API key), so every chunk task of a process shares one
    client: one concurrency semaphore, one RPM/TPM pacer, one 429 pause and one fatal latch.
    The first caller's ``logger`` and ``pacer`` are kept: pass a stdlib logger, not a
    per-task-run logger; ``pacer`` holds ``--rpm``/``--tpm`` when the client itself does
    not (a Dask cluster's shared budget, ``tasks.embed.cluster_budget``).
    The API key comes from ``api_key_from_env()``; with none, a WARNING (once per base URL)
    says no ``Authorization`` header is sent.

    :raises FatalError: local embedder with an unsupported model or dimensions.
    :raises InputError: openai embedder with a base URL that is not http(s).
    """
    api_key = api_key_from_env() if settings.embedder == "openai" else None
    key = _cache_key(settings, api_key)
    with _embedders_lock:
        client = _embedders.get(key)
        if client is None:
            client = _new_embedder(
                settings, api_key, logger or logging.getLogger(HTTP_LOGGER), pacer
            )
            _embedders[key] = client
        return client


def build_batch_client(settings: RunSettings, *, logger: Logger | None = None) -> BatchClient:
    """Return the process's shared Batch API client for ``settings`` (``--base-url``, the
    API key from the environment and its header, ``--max-attempts``), created on first use.

    :raises InputError: a base URL that is not http(s).
    """
    api_key = api_key_from_env()
    key = (
        "batch",
        settings.base_url,
        settings.max_attempts,
        auth_header_for(settings.auth_header),
        hashlib.sha256(api_key.encode()).hexdigest() if api_key else None,
    )
    with _embedders_lock:
        client = _batch_clients.get(key)
        if client is None:
            client = BatchClient(
                base_url=settings.base_url,
                api_key=api_key,
                timeout_s=max(settings.timeout_s, 120.0),
                max_attempts=settings.max_attempts,
                auth_header=auth_header_for(settings.auth_header),
                logger=logger or logging.getLogger(HTTP_LOGGER),
            )
            _batch_clients[key] = client
        return client


def close_embedders() -> None:
    """Close and forget every cached client (end of a run, or between tests)."""
    with _embedders_lock:
        clients: list[EmbeddingClient | BatchClient] = [
            *_embedders.values(),
            *_batch_clients.values(),
        ]
        _embedders.clear()
        _batch_clients.clear()
        _warned_no_key.clear()
    for client in clients:
        client.close()


def _cache_key(settings: RunSettings, api_key: str | None) -> tuple[object, ...]:
    key_digest = hashlib.sha256(api_key.encode()).hexdigest() if api_key else None
    return (
        settings.embedder,
        settings.effective_model,
        settings.base_url,
        settings.dimensions,
        settings.timeout_s,
        settings.max_attempts,
        settings.concurrency,
        settings.rpm,
        settings.tpm,
        key_digest,
        auth_header_for(settings.auth_header),
        settings.encoding_format,
        settings.max_cost,
        settings.price_per_million_tokens,
    )


def _new_embedder(
    settings: RunSettings, api_key: str | None, logger: Logger, pacer: Pacer | None
) -> EmbeddingClient:
    if settings.embedder == "local":
        return LocalEmbedder(
            model=settings.effective_model, dimensions=settings.dimensions, logger=logger
        )
    if api_key is None and settings.base_url not in _warned_no_key:
        _warned_no_key.add(settings.base_url)
        logger.warning(
            "no API key in EMBEDLINE_API_KEY or OPENAI_API_KEY: requests to %s carry no "
            "Authorization header",
            safe_url(settings.base_url),
        )
    return OpenAIEmbedder(
        base_url=settings.base_url,
        model=settings.effective_model,
        dimensions=settings.dimensions,
        api_key=api_key,
        timeout_s=settings.timeout_s,
        max_attempts=settings.max_attempts,
        concurrency=settings.concurrency,
        rpm=settings.rpm,
        tpm=settings.tpm,
        pacer=pacer,
        auth_header=auth_header_for(settings.auth_header),
        encoding_format=settings.encoding_format,
        spend=(
            SpendCap(
                max_cost=settings.max_cost,
                price_per_million=settings.price_per_million_tokens or 0.0,
            )
            if settings.max_cost is not None
            else None
        ),
        logger=logger,
    )
