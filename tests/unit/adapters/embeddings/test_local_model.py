"""The torch-free all-MiniLM-L6-v2 (``adapters.minilm``, on onnxruntime) against vectors
sentence-transformers computed (``tests/data/minilm_reference.json``, made once by
``tests/support/make_local_reference.py`` with sentence-transformers 6.2.0 and torch 2.13.0,
independent of the code under test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adapters.minilm import MiniLM

REPO = Path(__file__).resolve().parents[4]
REFERENCE = json.loads((REPO / "tests" / "data" / "minilm_reference.json").read_text())


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return MiniLM()


def test_vectors_are_within_1e_3_cosine_of_sentence_transformers(model: MiniLM) -> None:
    texts = REFERENCE["texts"]
    expected = np.asarray(REFERENCE["vectors"], dtype=np.float32)
    got = model.encode(texts, batch_size=7)  # several sorted batches of mixed lengths
    cosine = (got * expected).sum(axis=1) / np.linalg.norm(expected, axis=1)
    assert got.shape == (len(texts), 384) and got.dtype == np.float32
    assert cosine.min() >= 1 - 1e-3, (cosine.argmin(), cosine.min())
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_results_do_not_depend_on_batching(model: MiniLM) -> None:
    texts = REFERENCE["texts"][:12]
    one_by_one = np.stack([model.encode([t])[0] for t in texts])
    together = model.encode(texts, batch_size=64)
    np.testing.assert_allclose(together, one_by_one, atol=2e-5)


def test_one_thread_gives_the_same_vectors(model: MiniLM) -> None:
    texts = REFERENCE["texts"][:8]
    np.testing.assert_allclose(MiniLM(threads=1).encode(texts), model.encode(texts), atol=2e-5)


def test_long_inputs_are_truncated_at_256_word_pieces(model: MiniLM) -> None:
    long = " ".join(f"word{i}" for i in range(2000))
    assert model.max_tokens == 256
    np.testing.assert_allclose(model.encode([long]), model.encode([long + " tail"]), atol=1e-6)


def test_the_local_embedder_never_imports_torch() -> None:
    code = (
        "import sys; from adapters.embeddings import LocalEmbedder; "
        "LocalEmbedder().embed(['hello'], idempotency_key='k'); "
        "print([m for m in ('torch', 'transformers', 'sentence_transformers') "
        "if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
