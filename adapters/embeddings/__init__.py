"""Embedding clients: any OpenAI-compatible ``POST {base_url}/embeddings`` (httpx), and the
embedded local model (all-MiniLM-L6-v2 on onnxruntime, ``adapters.minilm``, 384 dimensions).

Both satisfy ``embedline.protocols.EmbeddingClient``. The HTTP client retries and classifies
every failure into the classes of docs/reference/failure-classes.md (``classify``,
``classify_transport_error``); callers see only embedline errors. It paces its requests under
``--rpm``/``--tpm`` (``adapters.rate_limit``), stops sending for good after a fatal answer, and
never sleeps a server wait above ``max_wait_s`` inside a task (``RetryLaterError``). Nothing here
logs or raises with input text, vectors, the API key or the ``Idempotency-Key`` value. This package
never imports prefect, and never imports torch (the local model runs without it).

One module per concern; imports go down this list, never up:

- ``common``: the logger type and names;
- ``endpoint``: the URL, the API key from the environment and the header that carries it;
- ``classify``: HTTP answers and transport failures → embedline errors;
- ``decode``: a 2xx body → a float32 matrix in request order;
- ``caps``, ``pause``, ``latch``, ``encoding``: the client's shared state, one small object
  each (learned request caps and the token estimate, the 429 pause, the fatal latch and
  circuit breaker, the base64 ↔ float negotiation);
- ``openai_compatible``: ``OpenAIEmbedder``, built of the above;
- ``local``: ``LocalEmbedder``;
- ``openai_batch``: ``BatchClient``, OpenAI's Batch API (files, batches) for ``--batch-api``;
- ``factory``: ``build_embedder``, one shared client per configuration and process.

Rule sources: OpenAI embeddings API reference
(https://platform.openai.com/docs/api-reference/embeddings) for the request/response shape,
``encoding_format``, ``dimensions`` and ``usage``; OpenAI error codes guide
(https://platform.openai.com/docs/guides/error-codes) for 401/403/429/``insufficient_quota``;
RFC 9110 §10.2.3 for ``Retry-After`` (via ``embedline.retry``); OpenAI rate-limits guide
(https://platform.openai.com/docs/guides/rate-limits) for RPM/TPM.
"""

from adapters.embeddings.caps import RequestCaps, approximate_tokens, estimate_tokens
from adapters.embeddings.classify import classify, classify_transport_error
from adapters.embeddings.endpoint import AUTH_HEADER_ENV, api_key_from_env, auth_header_for
from adapters.embeddings.factory import build_batch_client, build_embedder, close_embedders
from adapters.embeddings.local import LocalEmbedder
from adapters.embeddings.openai_compatible import OpenAIEmbedder

__all__ = [
    "AUTH_HEADER_ENV",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "RequestCaps",
    "api_key_from_env",
    "approximate_tokens",
    "auth_header_for",
    "build_batch_client",
    "build_embedder",
    "classify",
    "classify_transport_error",
    "close_embedders",
    "estimate_tokens",
]
