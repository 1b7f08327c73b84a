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


@pytest.mark.parametrize("param", ["password", "sslpassword", "oauth_client_secret"])
def test_a_secret_query_parameter_is_refused_without_echoing_it(param: str) -> None:
    with pytest.raises(InputError) as caught:
        validate_sink_uri(f"postgresql://app@db.example/vectors?{param}=s3cret&table=docs")
    assert "PGPASSWORD" in str(caught.value)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("postgresql://app@/vectors?host=/tmp/sock&tabel=docs", "'tabel'"),
        ("postgresql://app@/vectors?host=/tmp/sock?table=docs", "second '?'"),
        ("postgres://app@/vectors?sslmode=require&hots=db", "'hots'"),
    ],
    ids=["misspelled-table", "second-question-mark", "misspelled-libpq-param"],
)
def test_a_postgres_uri_libpq_cannot_parse_is_an_input_error_before_any_connect(
    uri: str, named: str
) -> None:
    with pytest.raises(InputError) as caught:
        validate_sink_uri(uri)
    message = str(caught.value)
    assert named in message and "&" in message
    assert "server is running" not in message


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("sslmode=requre", "sslmode='requre' is not one of disable, allow, prefer"),
        ("port=abc", "port='abc' is not a whole number"),
        ("host=a,b&port=5432,x", "port='5432,x'"),
        ("connect_timeout=x", "connect_timeout='x'"),
        ("target_session_attrs=primary-ish", "target_session_attrs="),
        ("gssencmode=yes", "gssencmode='yes'"),
    ],
)
def test_a_libpq_parameter_value_libpq_would_refuse_is_an_input_error_before_any_connect(
    query: str, named: str
) -> None:
    """libpq checks a value only when it connects: after the run had embedded and
    committed, with "check that the server is running"."""
    with pytest.raises(InputError) as caught:
        validate_sink_uri(f"postgresql://app@/vectors?{query}&table=docs")
    assert named in str(caught.value) and "server is running" not in str(caught.value)
    validate_sink_uri("postgresql://app@/v?sslmode=verify-full&port=5432,6432&host=a,b")


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


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "mysql://x/y",
        "lancedb://",
        "lancedb:///x?table=1bad",
        "lancedb:///x?mode=overwrite",
        "out/vectors.parquet",
    ],
)
def test_unusable_sink_uris_are_input_errors(uri: str) -> None:
    with pytest.raises(InputError):
        validate_sink_uri(uri)


def test_qdrant_uris_name_a_server_or_a_local_directory(tmp_path: Path) -> None:
    pytest.importorskip("qdrant_client")
    sink = open_sink("qdrant://vectors.example:6334/packages")
    assert (sink.url, sink.collection, sink.local) == (
        "http://vectors.example:6334",
        "packages",
        False,
    )
    assert sink.identity == "qdrant://vectors.example:6334/packages"
    assert open_sink("qdrant+https://vectors.example/p").url == "https://vectors.example:6333"
    local = open_sink(f"qdrant+local://{tmp_path}/q dir#1?collection=docs")
    assert (local.path, local.collection, local.local) == (f"{tmp_path}/q dir#1", "docs", True)
    assert local.identity == f"qdrant+local://{tmp_path}/q dir#1?collection=docs"
    assert open_sink(f"qdrant+local://{tmp_path}").collection == "embeddings"


def test_an_api_key_in_a_qdrant_uri_is_refused_without_echoing_it() -> None:
    with pytest.raises(InputError) as caught:
        validate_sink_uri("qdrant://s3cretkey@vectors.example:6333/packages")
    assert "QDRANT_API_KEY" in str(caught.value)
    assert "s3cretkey" not in str(caught.value)


def test_the_qdrant_api_key_comes_from_the_environment_and_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("qdrant_client")
    monkeypatch.setenv("QDRANT_API_KEY", "k-s3cret")
    sink = open_sink("qdrant+https://vectors.example/packages")
    client = sink._client()  # builds the client; connects only on the first call
    assert "k-s3cret" not in repr(sink) + sink.identity
    assert client._client.openapi_client.client._client.headers.get("api-key") == "k-s3cret"
    sink.close()


@pytest.mark.parametrize(
    "uri",
    [
        "qdrant://host:6333/",
        "qdrant://host:6333/a/b?x=1",
        "qdrant://host:x/c",
        "qdrant://host/bad name",
        "qdrant+local://",
        "qdrant+local:///x?table=t",
        "qdrant+local:///x?collection=a&collection=b",
    ],
)
def test_unusable_qdrant_uris_are_input_errors(uri: str) -> None:
    with pytest.raises(InputError):
        validate_sink_uri(uri)


@pytest.mark.parametrize(
    "form",
    [
        "lancedb://{file}?table=t",
        "lancedb://{file}/under?table=t",
        "{file}/docs.lance",
        "qdrant+local://{file}?collection=c",
        "qdrant+local://{file}/sub?collection=c",
    ],
)
def test_a_local_sink_path_that_is_a_file_is_an_input_error_naming_it(
    tmp_path: Path, form: str
) -> None:
    """It failed at the store's open, after the run: a traceback and exit 1."""
    data = tmp_path / "ja.csv"
    data.write_text("id,text\n")
    with pytest.raises(InputError) as caught:
        validate_sink_uri(form.format(file=data))
    assert f"{data} is a file" in str(caught.value)
    validate_sink_uri(form.format(file=tmp_path / "new" / "db"))  # absent: created later


@pytest.mark.parametrize(
    ("sink", "instead"),
    [
        ("postgresql://app:s3cret@db/v?table=t", "set PGPASSWORD instead"),
        ("qdrant://key:s3cret@vectors:6333/docs", "set QDRANT_API_KEY instead"),
    ],
)
def test_run_refuses_a_password_in_the_sink_and_names_the_stores_own_setting(
    sink: str, instead: str
) -> None:
    """``run --sink`` with a password said "set PGPASSWORD" for a Qdrant URI too."""
    from pydantic import ValidationError

    from embedline.settings import RunSettings

    with pytest.raises(ValidationError) as caught:
        RunSettings(input="in.csv", sink=sink)
    [error] = caught.value.errors()  # the CLI prints its message, not the input
    assert instead in error["msg"] and "s3cret" not in error["msg"]


def test_a_server_that_does_not_answer_is_not_a_refusal_but_is_reported() -> None:
    """Nothing listens on port 1: not fatal (it may be back by the load), but returned, so
    ``run --sink`` warns before it pays; a local store is not checked."""
    from adapters.sinks import server_refusal
    from embedline.errors import EmbedlineError, FatalError

    found = server_refusal("postgresql://alice@127.0.0.1:1/db?table=t")
    assert isinstance(found, EmbedlineError) and not isinstance(found, FatalError)
    assert "postgresql://alice@127.0.0.1:1/db" in str(found) and "\n" not in str(found)
    assert server_refusal("lancedb://./nowhere?table=t") is None
