"""Checks that the vectors of an answer agree with the request and the run
(docs/reference/failure-classes.md, "bad response"): one numeric vector per input, all of one
length, the run's length when it is known, every value finite. No I/O; used by the embedding clients
and the chunk task.

Rule source: OpenAI embeddings API reference
(https://platform.openai.com/docs/api-reference/embeddings/object): ``embedding`` is a
list of floats (``encoding_format: "float"``) or a base64 string of little-endian float32
(``"base64"``); its length is the model's, or the requested ``dimensions``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import numpy as np

from embedline.errors import BadResponseError

__all__ = ["check_length", "decode_vector", "stack_vectors"]


def decode_vector(value: object, index: int) -> np.ndarray:
    """Decode one ``embedding`` into a 1-D array: base64 (little-endian float32) or a JSON
    list of numbers (ints or floats; never strings, booleans, nulls or nested lists).

    :raises BadResponseError: anything else, naming the input's ``index``.
    """
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise BadResponseError(f"embedding {index} is not valid base64") from None
        if not raw or len(raw) % 4:
            raise BadResponseError(f"embedding {index} is not a whole number of float32")
        return np.frombuffer(raw, dtype="<f4")
    if isinstance(value, list):
        try:
            parsed = np.asarray(value)
        except (TypeError, ValueError):  # ragged nesting
            raise BadResponseError(f"embedding {index} holds non-numbers") from None
        if parsed.dtype.kind not in "iuf":  # "0.1" as a string, true/false, null, objects
            raise BadResponseError(
                f"embedding {index} holds {_kind(parsed.dtype)} instead of numbers"
            )
        if parsed.ndim == 1 and parsed.size:
            with np.errstate(over="ignore", invalid="ignore"):
                return parsed.astype(np.float32)
    raise BadResponseError(f"embedding {index} is neither base64 nor a list of numbers")


def _kind(dtype: np.dtype) -> str:
    return {"U": "strings", "S": "strings", "b": "booleans"}.get(dtype.kind, "non-numbers")


def stack_vectors(rows: Sequence[np.ndarray], dimensions: int | None) -> np.ndarray:
    """Stack one answer's vectors into float32 ``(len(rows), d)``.

    ``dimensions``: the length every vector must have (``--dimensions``, or the run's length
    once known: ``check_length``); None accepts any one length.

    :raises BadResponseError: vectors of unequal length, of another length than
        ``dimensions``, or holding NaN/Inf.
    """
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise BadResponseError(f"embeddings of different lengths: {sorted(lengths)[:5]}")
    (length,) = lengths
    check_length(length, dimensions)
    matrix = np.stack(rows).astype(np.float32, copy=False)
    if not np.isfinite(matrix).all():
        raise BadResponseError("embeddings contain NaN or Inf")
    return matrix


def check_length(length: int, dimensions: int | None) -> None:
    """:raises BadResponseError: ``length`` is not ``dimensions`` (None: any length).

    The message names both lengths and what pins one: a server whose default length
    changed mid-run gives vectors a run cannot mix."""
    if dimensions is not None and length != dimensions:
        raise BadResponseError(
            f"expected {dimensions} dimensions, got {length}: the server's vectors do not "
            "have the run's length (pass --dimensions to pin one)"
        )
