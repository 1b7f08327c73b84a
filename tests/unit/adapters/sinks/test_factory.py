"""Sink URIs: which store a URI names, and what it refuses (adapters/sinks/factory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.sinks import open_sink, validate_sink_uri
from embedline.errors import InputError


def test_password_in_a_postgres_uri_is_refused_without_echoing_it() -> None:
    with pytest.raises(InputError) as caught:
        validate_sink_uri("postgresql://app:s3cret@db.example:5432/vectors")
    assert "PGPASSWORD" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_postgres_uri_keeps_libpq_params_and_takes_the_table_out() -> None:
    pytest.importorskip("psycopg")
    sink = open_sink("postgresql://app@/vectors?host=/tmp/sock&table=docs")
    assert sink.dsn == "postgresql://app@/vectors?host=%2Ftmp%2Fsock"
    assert sink.table_name == "docs"
    assert "table=docs" in sink.identity


def test_lance_path_names_database_and_table(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "db" / "packages.lance"))
    assert (sink.path, sink.table_name) == (str(tmp_path / "db"), "packages")
    sink = open_sink(f"lancedb://{tmp_path}/db")
    assert (sink.path, sink.table_name) == (str(tmp_path / "db"), "embeddings")


@pytest.mark.parametrize("uri", ["", "mysql://x/y", "lancedb://", "lancedb:///x?table=1bad",
                                 "lancedb:///x?mode=overwrite", "out/vectors.parquet"])
def test_unusable_sink_uris_are_input_errors(uri: str) -> None:
    with pytest.raises(InputError):
        validate_sink_uri(uri)

