"""The one URI parser (adapters/uris.py) and the openers routed through it: names are literal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapters.input_source import open_input
from adapters.object_store import LocalDirStore, S3Store, open_store
from adapters.sinks import open_sink, validate_sink_uri
from adapters.uris import redact, split_location
from embedline.errors import InputError

ODD_KEY = "exports/2026 #1?v=2/naïve%20+x.csv"


@pytest.mark.parametrize(
    "key", [ODD_KEY, "a#b", "a?b", "a%2Fb", "a+b", "a b", "ü/ß.csv", "x?table=t#frag"]
)
def test_s3_key_is_kept_exactly_as_written(key: str) -> None:
    found = split_location(f"s3://bucket/{key}", what="input", forms="")
    assert (found.kind, found.bucket, found.key) == ("s3", "bucket", key)


def test_input_opens_the_literal_key() -> None:
    found = open_input(f"s3://b/{ODD_KEY}")
    assert (found.bucket, found.key, found.uri) == ("b", ODD_KEY, f"s3://b/{ODD_KEY}")


def test_output_prefix_is_kept_exactly_as_written() -> None:
    store = open_store("s3://b/out #1?x=%20/")
    assert isinstance(store, S3Store)
    assert store.prefix == "out #1?x=%20"
    assert store.uri_for("m.json") == "s3://b/out #1?x=%20/m.json"


def test_plain_local_paths_are_literal(tmp_path: Path) -> None:
    out = tmp_path / "out#1?a=%20"
    store = open_store(str(out))
    assert isinstance(store, LocalDirStore)
    assert os.fspath(store.root) == str(out)  # type: ignore[attr-defined]
    csv = tmp_path / "in #1%20.csv"
    assert open_input(str(csv)).uri == str(csv)


def test_file_uris_are_percent_decoded_per_rfc_8089(tmp_path: Path) -> None:
    found = split_location(f"file://{tmp_path}/out%231%20x", what="--output", forms="")
    assert found.path == f"{tmp_path}/out#1 x"
    assert split_location("file://localhost/a/b", what="--output", forms="").path == "/a/b"


@pytest.mark.parametrize(
    "uri",
    ["file:///tmp/out#1", "file:///tmp/a?b", "file://host/x", "file://relative", "file:///x%ff"],
)
def test_file_uris_with_raw_query_fragment_or_no_absolute_path_are_refused(uri: str) -> None:
    with pytest.raises(InputError) as info:
        open_store(uri)
    message = str(info.value)
    assert uri in message and "\n" not in message


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("s3://", "no bucket"),
        ("s3:///key", "no bucket"),
        ("s3://u:p@b/k", "credentials"),
        ("s3://b#x/k", "not a valid bucket"),
        ("s3://b?x", "not a valid bucket"),
        ("gs://b/k", "unsupported scheme"),
        ("  ", "is empty"),
    ],
)
def test_bad_s3_uris_are_refused_in_one_line(uri: str, says: str) -> None:
    with pytest.raises(InputError) as info:
        split_location(uri, what="--output", forms="use s3://bucket")
    assert says in str(info.value) and "\n" not in str(info.value)
    assert "p@" not in str(info.value)


def test_lancedb_path_is_literal_and_table_query_kept(tmp_path: Path) -> None:
    sink = open_sink(f"lancedb://{tmp_path}/db%20x+1?table=docs")
    assert sink.path == f"{tmp_path}/db%20x+1"  # type: ignore[attr-defined]
    assert sink.table_name == "docs"  # type: ignore[attr-defined]


def test_dot_lance_form_keeps_hash_and_question_mark(tmp_path: Path) -> None:
    sink = open_sink(f"{tmp_path}/db #1?v=2/docs.lance")
    assert sink.path == f"{tmp_path}/db #1?v=2"  # type: ignore[attr-defined]
    assert sink.table_name == "docs"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("uri", "path", "table"),
    [
        ("lancedb:///data/db #1", "/data/db #1", "embeddings"),
        ("lancedb:///data/a?b/db?table=t", "/data/a?b/db", "t"),
        ("lancedb:///data/db?v=2?table=docs", "/data/db?v=2", "docs"),  # a sink's identity
    ],
)
def test_lancedb_query_is_after_the_last_question_mark(uri: str, path: str, table: str) -> None:
    sink = open_sink(uri)
    assert (sink.path, sink.table_name) == (path, table)  # type: ignore[attr-defined]
    assert open_sink(sink.identity).path == path  # type: ignore[attr-defined]


@pytest.mark.parametrize("uri", ["lancedb:///data/a?b/db", "lancedb:///data/db?v=2"])
def test_lancedb_path_with_question_mark_and_no_table_is_refused(uri: str) -> None:
    with pytest.raises(InputError) as info:
        validate_sink_uri(uri)
    message = str(info.value)
    assert uri in message and "PATH/NAME.lance" in message and "\n" not in message


@pytest.mark.parametrize(
    "uri", ["s3://b/out #1?x=%20+ü/", "s3://b/a%2Fb#c", "file:///tmp/o%231", "./out#1?v=%20"]
)
def test_a_stores_uri_reopens_the_same_store(uri: str) -> None:
    """Dask workers get the store's URI as a string and reopen it (tasks/embed/task.store_for):
    the reopened store must name the same keys."""
    import pickle

    from tasks.embed.task import store_for

    store = open_store(uri)
    for again in (open_store(store.uri), store_for(store.uri), pickle.loads(pickle.dumps(store))):
        assert type(again) is type(store) and again.uri == store.uri
        assert again.uri_for("manifests/m.json") == store.uri_for("manifests/m.json")


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/v", "postgresql://app:***@db:5432/v"),
        ("postgres://app:s3c@ret@db/v", "postgres://app:***@db/v"),
        ("postgresql://app@db/v", "postgresql://app@db/v"),
        (
            "postgresql://db/v?user=app&password=s3cret&sslmode=require",
            "postgresql://db/v?user=app&password=***&sslmode=require",
        ),
        ("postgresql://db:5432?options=a@b", "postgresql://db:5432?options=a@b"),
        ("qdrant://s3cret@vectors:6333/docs", "qdrant://***@vectors:6333/docs"),
        ("qdrant://a:s3c@ret@vectors/docs", "qdrant://***@vectors/docs"),
        ("s3://bucket/key@s3cret:1", "s3://bucket/key@s3cret:1"),
        ("qdrant://vectors/docs?api_key=s3cret", "qdrant://vectors/docs?api_key=***"),
        ("qdrant://vectors/docs?x=1&API_KEY=s3cret", "qdrant://vectors/docs?x=1&API_KEY=***"),
        (
            "postgresql://db/v?oauth_client_secret=s3cret",
            "postgresql://db/v?oauth_client_secret=***",
        ),
    ],
)
def test_redact_hides_secrets_and_keeps_a_postgresql_user(uri: str, shown: str) -> None:
    """The user a server refused is named; a password, a libpq secret parameter and any
    other scheme's user part (an API key) are not. An S3 key is not userinfo."""
    assert redact(uri) == shown
