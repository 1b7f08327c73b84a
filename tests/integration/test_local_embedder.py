"""LocalEmbedder with the real all-MiniLM-L6-v2 weights (onnxruntime, no torch: about a second)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from adapters.embeddings import LocalEmbedder

pytestmark = pytest.mark.integration

TEXTS = ["The cat sits on the mat.", "A kitten rests on a rug.", "株価は今日下がった。"]


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    return LocalEmbedder()


def test_three_texts_give_finite_unit_float32_vectors(embedder: LocalEmbedder) -> None:
    result = embedder.embed(TEXTS, idempotency_key="k")
    assert result.vectors.shape == (3, 384) and result.vectors.dtype == np.float32
    assert np.isfinite(result.vectors).all()
    np.testing.assert_allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=1e-5)
    assert result.tokens == 0 and result.requests == 0


def test_embeddings_are_deterministic_and_meaningful(embedder: LocalEmbedder) -> None:
    first = embedder.embed(TEXTS, idempotency_key="k").vectors
    second = embedder.embed(TEXTS, idempotency_key="k").vectors
    np.testing.assert_allclose(first, second, atol=1e-6)
    similar, unrelated = first[0] @ first[1], first[0] @ first[2]
    assert similar > unrelated + 0.2  # a real model, not noise


def test_concurrent_calls_share_one_model_and_agree(embedder: LocalEmbedder) -> None:
    results: list[np.ndarray] = []

    def run() -> None:
        results.append(LocalEmbedder().embed(TEXTS[:1], idempotency_key="k").vectors)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    for vectors in results:
        np.testing.assert_allclose(vectors, results[0], atol=1e-6)
