"""The sinks package: its exports, and a factory that checks a URI without importing any
store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import adapters.sinks
from adapters.sinks.base import vector_matrix
from adapters.sinks.factory import KINDS, validate_sink_uri
from embedline.errors import InputError

REPO = Path(__file__).resolve().parents[4]


def test_package_exports_a_closed_list() -> None:
    assert adapters.sinks.__all__ == [
        "DEFAULT_TABLE",
        "SINK_FORMAT",
        "check_compatible",
        "is_sink_uri",
        "open_sink",
        "server_refusal",
        "sink_metadata",
        "sink_table_from_metadata",
        "validate_sink_uri",
    ]
    for name in adapters.sinks.__all__:
        assert hasattr(adapters.sinks, name)


def test_checking_a_uri_imports_no_store() -> None:
    code = (
        "import sys; from adapters.sinks import validate_sink_uri; "
        "validate_sink_uri('lancedb:///tmp/x?table=t'); "
        "validate_sink_uri('postgresql://app@db/vectors?table=t'); "
        "validate_sink_uri('qdrant://db:6333/vectors'); "
        "validate_sink_uri('qdrant+local:///tmp/q?collection=c'); "
        "print(sorted(m for m in sys.modules if m in ('adapters.sinks.lancedb', "
        "'adapters.sinks.pgvector', 'adapters.sinks.qdrant', 'lancedb', 'psycopg', "
        "'qdrant_client')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_refusal_lists_every_stores_forms() -> None:
    with pytest.raises(InputError) as caught:
        validate_sink_uri("mysql://x/y")
    for kind in KINDS:
        for form in kind.forms:
            assert form in str(caught.value)


def test_vector_matrix_is_rows_by_dimensions() -> None:
    values = np.arange(6, dtype=np.float32)
    rows = pa.table({"embedding": pa.FixedSizeListArray.from_arrays(pa.array(values), 3)})
    matrix = vector_matrix(rows)
    assert matrix.shape == (2, 3)
    assert matrix[1].tolist() == [3.0, 4.0, 5.0]
