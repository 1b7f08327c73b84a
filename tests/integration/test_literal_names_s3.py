"""Names are literal on S3 (moto): an input key and an output prefix holding ``#``, ``?``,
``%``, ``+``, spaces and non-ASCII are read and written exactly as written by run, load,
search, gc and ``embedline.read_embeddings`` — before, ``#…`` became a fragment, ``?…`` a
query and ``%20`` a space, reading and writing other keys (or refusing the output)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import embedline
from tests.support.fake_openai import FakeEmbeddingServer
from tests.support.fixtures import run_cli
from tests.support.moto_server import moto_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

INPUT_KEY = "exports/2026 #1?v=2/naïve%20+x.csv"
PREFIX = "out #1?x=%20+ü"


def _keys(client: Any, bucket: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_run_load_search_gc_keep_odd_names_literal(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [(f"r{i}", f"row number {i} of kind {i % 5}") for i in range(12)]
    body = "id,text\n" + "".join(f"{i},{t}\n" for i, t in rows)
    s3_client.put_object(Bucket=s3_bucket, Key=INPUT_KEY, Body=body.encode())
    env = moto_env(moto_endpoint)
    source, output = f"s3://{s3_bucket}/{INPUT_KEY}", f"s3://{s3_bucket}/{PREFIX}/"
    sink = f"{tmp_path}/db #1?v=2/docs.lance"
    common = [
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--ledger",
        "l.db",
        "--chunk-size",
        "5",
    ]
    first = run_cli(
        "run", source, "--output", output, "--sink", sink, *common, cwd=tmp_path, env=env
    )
    assert first.returncode == 0, first.stderr[-3000:]

    keys = _keys(s3_client, s3_bucket)
    assert INPUT_KEY in keys
    # every object is under the literal prefix: nothing under "out " / "out #1" / a decoded one
    assert {k.split("/", 1)[0] for k in keys} == {"exports", PREFIX}, keys
    assert any(k.startswith(f"{PREFIX}/manifests/") for k in keys), keys

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    frame = embedline.read_embeddings(output)
    assert frame["id"].tolist() == [i for i, _ in rows]
    assert np.stack(frame["embedding"].to_list()).shape == (12, 384)

    # the .lance form keeps '#' and '?' of the database path literally
    assert (tmp_path / "db #1?v=2" / "docs.lance").is_dir()
    assert not (tmp_path / "db ").exists() and not (tmp_path / "db #1").exists()
    loaded = run_cli(
        "load",
        "--to",
        f"lancedb://{tmp_path}/db %20+x?table=t",
        "--output",
        output,
        "--ledger",
        "l.db",
        cwd=tmp_path,
        env=env,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert (tmp_path / "db %20+x" / "t.lance").is_dir()
    assert re.search(r"^rows +12 upserted now", loaded.stdout, re.M), loaded.stdout

    for target in (output, sink):
        found = run_cli(
            "search", target, rows[7][1], "--k", "1", "--ledger", "l.db", cwd=tmp_path, env=env
        )
        assert found.returncode == 0, found.stderr[-2000:]
        assert found.stdout.strip().splitlines()[1].split()[2] == "r7", found.stdout

    # a second run of an edited input; gc keeping one run deletes the first run's manifest
    edited = body.replace("row number 0 ", "row number zero ")
    s3_client.put_object(Bucket=s3_bucket, Key=INPUT_KEY, Body=edited.encode())
    second = run_cli("run", source, "--output", output, *common, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    manifests = [k for k in _keys(s3_client, s3_bucket) if k.startswith(f"{PREFIX}/manifests/")]
    assert len(manifests) == 2, manifests
    swept = run_cli(
        "gc", output, "--keep-runs", "1", "--grace", "0s", "--ledger", "l.db", cwd=tmp_path, env=env
    )
    assert swept.returncode == 0, swept.stderr[-2000:]
    after = _keys(s3_client, s3_bucket)
    assert len([k for k in after if k.startswith(f"{PREFIX}/manifests/")]) == 1, after
    assert {k.split("/", 1)[0] for k in after} == {"exports", PREFIX}, after
