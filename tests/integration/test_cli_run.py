"""``embedline run`` end to end: a real CLI process, a real embeddings server on loopback, a
real Prefect server, local and S3 outputs (moto, and ministack for the main job, over HTTP)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

from embedline import keys
from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.moto_server import moto_env
from tests.support.output import read_local_output, vectors_by_id
from tests.support.s3_servers import make_bucket, shared_client

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]


def _csv(path: Path, rows: list[tuple[str, str]], header: tuple[str, str] = ("id", "text")) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _rows(n: int) -> list[tuple[str, str]]:
    return [(f"{i:03d}", f'description {i}\nsecond line, with "quotes" {i * 7}') for i in range(n)]


def _run(tmp_path: Path, server: FakeEmbeddingServer, *extra: str) -> tuple[int, str, str]:
    args = [
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        *extra,
    ]
    result = run_cli(*args, cwd=tmp_path)
    return result.returncode, result.stdout, result.stderr


def test_run_publishes_every_row_with_its_own_vector(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = _rows(25)
    _csv(tmp_path / "in.csv", rows)
    fake_openai.shuffle_index = True  # data items come back in reverse index order
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "10", "--batch-size", "4")
    assert code == 0, err
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_published"] == 25 and manifest["rows_failed"] == 0
    assert manifest["input"]["rows"] == 25 and manifest["dimensions"] == 384
    assert [c["rows"] for c in manifest["chunks"]] == [10, 10, 5]
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)
    assert f"manifest   {tmp_path / 'out' / 'manifests'}" in out
    # keys are the documented ones
    sha = keys.text_sha256(rows[0][1])
    chunk0 = keys.chunk_key(
        "text-embedding-3-small", None, [(i, keys.text_sha256(t)) for i, t in rows[:10]]
    )
    assert manifest["chunks"][0]["key"] == chunk0
    assert manifest["chunks"][0]["object"] == f"chunks/{chunk0}.parquet"
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out" / manifest["chunks"][0]["object"])
    assert table.column("text_sha256")[0].as_py() == sha
    assert table.column("idempotency_key")[0].as_py() == keys.row_key(
        rows[0][0], sha, "text-embedding-3-small", None
    )
    # every request carried the Idempotency-Key of its rows
    assert all(entry["idempotency_key"] for entry in fake_openai.log)


def test_rerun_after_success_makes_zero_requests(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _csv(tmp_path / "in.csv", _rows(12))
    assert _run(tmp_path, fake_openai, "--chunk-size", "5")[0] == 0
    first = fake_openai.counters()["requests"]
    assert first > 0
    manifest_before = read_local_output(tmp_path / "out")[0]
    code, out, _ = _run(tmp_path, fake_openai, "--chunk-size", "5")
    assert code == 0 and "already" in out
    assert fake_openai.counters()["requests"] == first
    assert read_local_output(tmp_path / "out")[0] == manifest_before


def test_fresh_ledger_skips_published_chunks_after_head(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    _csv(tmp_path / "in.csv", _rows(12))
    assert _run(tmp_path, fake_openai, "--chunk-size", "5")[0] == 0
    for manifest in (tmp_path / "out" / "manifests").iterdir():
        manifest.unlink()  # the run is no longer committed ...
    (tmp_path / "ledger.sqlite3").unlink()  # ... and the ledger is gone
    before = fake_openai.counters()["requests"]
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "5")
    assert code == 0, err
    assert fake_openai.counters()["requests"] == before  # every chunk found in the store
    assert "3 skipped" in out
    assert read_local_output(tmp_path / "out")[0]["rows_published"] == 12


def test_empty_text_is_a_dead_letter_and_allow_failed_rows_commits(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = _rows(6)
    rows[2] = (rows[2][0], "")
    rows[4] = (rows[4][0], "   \n  ")
    _csv(tmp_path / "in.csv", rows)
    code, out, _ = _run(tmp_path, fake_openai, "--chunk-size", "3", "--on-empty-text", "fail")
    assert code == 1 and "2 rows are dead letters" in out
    assert "(the whole command: " in out  # the flow's wall time, and the command's
    assert not (tmp_path / "out" / "manifests").exists()
    run_key = out.split()[1]
    dead = run_cli(
        "dead-letters", run_key[:8], "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path
    )
    assert dead.returncode == 0
    assert dead.stdout.splitlines() == ["002\tempty_text\t", "004\tempty_text\t"]
    requests = fake_openai.counters()["requests"]
    code, out, err = _run(
        tmp_path, fake_openai, "--chunk-size", "3", "--allow-failed-rows", "--on-empty-text", "fail"
    )
    assert code == 0, err
    assert fake_openai.counters()["requests"] == requests  # dead letters are final
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_failed"] == 2 and manifest["rows_published"] == 4
    assert set(vectors) == {"000", "001", "003", "005"}
    status = run_cli("status", "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path)
    assert status.stdout.startswith(run_key) and "complete" in status.stdout
    as_json = run_cli(
        "status", "--json", "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path
    )
    (facts,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        ledger_row = db.execute(
            "SELECT status, rows_published, rows_failed, manifest_uri FROM runs WHERE run_key = ?",
            (run_key,),
        ).fetchone()
    assert (
        (facts["status"], facts["rows_published"], facts["dead_letters"], facts["manifest_uri"])
        == ledger_row
        == ("complete", 4, 2, ledger_row[3])
    )
    assert facts["chunks"] == {"published": 2, "failed": 0, "running": 0, "pending": 0}
    committed = facts["committed"]  # the embedline.run.committed payload
    assert committed["run_key"] == run_key and committed["dead_letters"] == 2
    assert committed["rows_added"] == 4 and committed["rows_published"] == 4
    assert committed["manifest_uri"] == ledger_row[3]
    assert ledger_row[3].endswith(f"manifests/{run_key}.json")


@pytest.mark.parametrize(
    ("content", "needle", "args"),
    [
        (b"id,body\n1,a\n", "no text column 'text'", ()),
        (b"id,text\n1,a\n1,b\n", "duplicated id", ()),
        (b"id,text\n1,a\n2,caf\xe9\n", ":3: byte 0xe9", ("--encoding", "utf-8")),
        (b"id,text\n1,a\n2,b,c\n", ":3: record has 3 fields", ()),
    ],
)
def test_input_errors_exit_2_before_any_request(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    content: bytes,
    needle: str,
    args: tuple[str, ...],
) -> None:
    (tmp_path / "in.csv").write_bytes(content)
    code, out, err = _run(tmp_path, fake_openai, *args)
    assert code == 2
    assert needle in out + err and "in.csv" in out + err
    assert fake_openai.counters()["requests"] == 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    result = run_cli("run", str(tmp_path / "missing.csv"), cwd=tmp_path)
    assert result.returncode == 2 and "no such file" in result.stderr
    result = run_cli("run", "x.csv", "--chunk-size", "0", cwd=tmp_path)
    assert result.returncode == 2 and "--chunk-size" in result.stderr


def _listing(s3: Any, bucket: str, prefix: str) -> dict[str, tuple[str, object]]:
    """key -> (ETag, LastModified) of every object under ``prefix``."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: (o["ETag"], o["LastModified"]) for o in listed}


def test_s3_output_then_a_fresh_ledger_rerun_rewrites_nothing(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, conditional_s3_endpoint: str
) -> None:
    """The main job on moto and on ministack: the start-up probe passes and every row is
    published. Then the ledger and the manifest go (a new machine, an uncommitted run): the
    rerun finds every chunk in the store by its conditional create, sends no embedding
    request, leaves every chunk object as it was (same ETag and LastModified) and commits
    the same chunks again."""
    bucket = make_bucket(conditional_s3_endpoint)
    rows = _rows(9)
    _csv(tmp_path / "in.csv", rows)
    env = moto_env(conditional_s3_endpoint)
    args = [
        "run",
        str(tmp_path / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        f"s3://{bucket}/emb/v1",
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "4",
    ]
    result = run_cli(*args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "does not enforce conditional writes" not in result.stderr
    assert f"s3://{bucket}/emb/v1/manifests/" in result.stdout
    s3 = shared_client(conditional_s3_endpoint)
    before = _listing(s3, bucket, "emb/v1/")
    manifest_key = next(n for n in sorted(before) if n.startswith("emb/v1/manifests/"))
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    bodies = {
        e["object"]: s3.get_object(Bucket=bucket, Key=f"emb/v1/{e['object']}")["Body"].read()
        for e in manifest["chunks"]
    }
    vectors = vectors_by_id(bodies, manifest)
    assert set(vectors) == {r[0] for r in rows}
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)
    head = s3.head_object(Bucket=bucket, Key=f"emb/v1/{manifest['chunks'][0]['object']}")
    assert head["Metadata"]["sha256"] == manifest["chunks"][0]["sha256"]
    assert not [k for k in before if "/_embedline/" in k]  # the probe cleaned up
    requests = fake_openai.counters()["requests"]
    s3.delete_object(Bucket=bucket, Key=manifest_key)
    (tmp_path / "ledger.sqlite3").unlink()
    newest = max(modified for _, modified in before.values()).timestamp()
    while time.time() < newest + 1.0:  # LastModified has whole seconds: a rewrite must show
        time.sleep(0.05)
    rerun = run_cli(*args, cwd=tmp_path, env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert fake_openai.counters()["requests"] == requests
    assert "3 skipped" in rerun.stdout
    after = _listing(s3, bucket, "emb/v1/")
    chunks = {k: v for k, v in before.items() if k != manifest_key}
    assert {k: v for k, v in after.items() if k != manifest_key} == chunks
    again = json.loads(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    assert again["chunks"] == manifest["chunks"]


def test_s3_input_is_streamed_and_chunk_reads_are_pinned_to_its_etag(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    rows = _rows(7)
    local = _csv(tmp_path / "local.csv", rows)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.put_object(Bucket=s3_bucket, Key="inputs/data.csv", Body=local.read_bytes())
    args = [
        "run",
        f"s3://{s3_bucket}/inputs/data.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "3",
    ]
    result = run_cli(*args, cwd=tmp_path, env={"AWS_ENDPOINT_URL": moto_endpoint})
    assert result.returncode == 0, result.stderr
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["input"]["name"] == "data.csv"
    assert manifest["input"]["bytes"] == local.stat().st_size
    import hashlib

    assert manifest["input"]["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)


def test_s3_input_changed_after_planning_is_refused(
    conditional_s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On moto and ministack: reads after planning are pinned to the ETag (If-Match)."""
    from adapters.csv_chunks import read_chunk
    from adapters.csv_source import plan_csv

    s3_bucket = make_bucket(conditional_s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", conditional_s3_endpoint)
    s3 = shared_client(conditional_s3_endpoint)
    s3.put_object(Bucket=s3_bucket, Key="in.csv", Body=b"id,text\n1,alpha\n2,beta\n")
    plan = plan_csv(
        f"s3://{s3_bucket}/in.csv",
        id_column="id",
        text_column="text",
        codec="utf-8",
        chunk_size=1,
        model="m",
        dimensions=None,
    )
    assert read_chunk(plan.source, plan.chunks[1])[0].id == "2"
    s3.put_object(Bucket=s3_bucket, Key="in.csv", Body=b"id,text\n1,alpha\n2,BETA\n")
    from embedline.errors import InputError

    with pytest.raises(InputError, match="changed while the run read it"):
        read_chunk(plan.source, plan.chunks[1])


def test_failed_chunks_then_retry_failed_embeds_only_those(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = _rows(20)
    rows[5] = (rows[5][0], "BROKEN " + rows[5][1])  # chunk 1 of 4 (5 rows each)
    rows[17] = (rows[17][0], "BROKEN " + rows[17][1])  # chunk 3
    _csv(tmp_path / "in.csv", rows)
    fake_openai.fail_when(
        lambda p: {"status": 503} if any("BROKEN" in t for t in p["input"]) else None
    )
    code, out, err = _run(
        tmp_path,
        fake_openai,
        "--chunk-size",
        "5",
        "--batch-size",
        "5",
        "--max-attempts",
        "2",
        "--chunk-retries",
        "0",
    )
    assert code == 1, err
    assert "2 of 4 chunks not published (2 failed; chunk 1: RetryableError: HTTP 503" in out
    run_key = out.split()[1]
    status = run_cli(
        "status", run_key[:10], "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path
    )
    assert "published=2 failed=2" in status.stdout
    fields = status.stdout.rstrip("\n").split("\t")
    assert len(fields) == 8 and fields[-1].startswith(
        "chunk 1 failed (and 1 more): RetryableError: HTTP 503"
    ), fields  # why, not only counts
    as_json = json.loads(
        run_cli(
            "status",
            run_key[:10],
            "--json",
            "--ledger",
            str(tmp_path / "ledger.sqlite3"),
            cwd=tmp_path,
        ).stdout
    )
    assert as_json["failure"] == fields[-1] and as_json["committed"] is None
    assert as_json["chunks"]["failed"] == 2 and as_json["status"] == "incomplete"
    fake_openai.fail_when(None)
    before = fake_openai.counters()["requests"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    retry = run_cli(
        "retry-failed", run_key[:12], "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=elsewhere
    )
    assert retry.returncode == 0, retry.stderr
    assert fake_openai.counters()["requests"] - before == 2  # one batch per failed chunk
    _manifest, vectors = read_local_output(tmp_path / "out")
    assert set(vectors) == {r[0] for r in rows}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--embedder", "local", "--dimensions", "128"], "384 dimensions"),
        (["--embedder", "local", "--model", "bge-large"], "--embedder openai"),
        (["--text-column", "body"], "no text column 'body'"),
    ],
)
def test_usage_and_header_errors_answer_before_prefect_starts(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    _csv(tmp_path / "in.csv", _rows(3))
    started = time.monotonic()
    result = run_cli("run", "in.csv", *args, cwd=tmp_path)
    assert result.returncode == 2 and needle in result.stderr
    assert time.monotonic() - started < 8  # no Prefect start-up, no model load
    assert "Traceback" not in result.stderr


def test_unusable_output_is_a_usage_error(tmp_path: Path, fake_openai: FakeEmbeddingServer) -> None:
    _csv(tmp_path / "in.csv", _rows(3))
    (tmp_path / "afile").write_text("not a directory")
    result = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "afile",
        "--ledger",
        "l.sqlite3",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "exists and is not a directory" in result.stdout + result.stderr
    assert fake_openai.counters()["requests"] == 0
    dirs = run_cli("run", str(tmp_path), cwd=tmp_path)
    assert dirs.returncode == 2 and "is a directory" in dirs.stderr


def test_rejected_long_input_is_isolated_and_no_request_body_is_sent_twice(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = _rows(8)
    rows[3] = (rows[3][0], "CONTEXT-TOO-LONG " + "word " * 50)  # the fourth text
    _csv(tmp_path / "in.csv", rows)
    fake_openai.reject_texts_containing = "CONTEXT-TOO-LONG"
    code, out, err = _run(
        tmp_path, fake_openai, "--chunk-size", "8", "--batch-size", "8", "--allow-failed-rows"
    )
    assert code == 0, err
    manifest, vectors = read_local_output(tmp_path / "out")
    assert manifest["rows_failed"] == 1 and set(vectors) == {
        r[0] for i, r in enumerate(rows) if i != 3
    }
    run_key = out.split()[1]
    dead = run_cli(
        "dead-letters", run_key[:8], "--ledger", str(tmp_path / "ledger.sqlite3"), cwd=tmp_path
    )
    assert dead.stdout.splitlines() == ["003\trejected\t400"]
    keys_sent = [entry["idempotency_key"] for entry in fake_openai.log]
    assert len(keys_sent) == len(set(keys_sent))  # a rejected body is never sent again


def test_max_input_tokens_truncate_and_dead_letter_before_sending(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = _rows(4)
    rows[1] = (rows[1][0], "x" * 400)
    _csv(tmp_path / "in.csv", rows)
    code, out, _ = _run(tmp_path, fake_openai, "--max-input-tokens", "50")
    assert code == 1 and "1 row is a dead letter" in out
    assert fake_openai.counters()["inputs"] == 3  # the long text was never sent


def test_a_truncated_texts_vector_is_keyed_by_the_cut_text_across_nights(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    """--on-too-long truncate: the vector of a cut text is stored under the cut text's hash,
    so a night without the limit sends the whole text, and a night with it reuses the cut."""
    rows = _rows(6)
    long_text = "ü" * 30 + "long text " * 40  # 460 bytes; the cut (150 bytes) ends mid-word
    rows[1] = (rows[1][0], long_text)
    _csv(tmp_path / "in.csv", rows)
    truncate = ("--max-input-tokens", "50", "--on-too-long", "truncate")
    cut = long_text.encode()[:150].decode("utf-8", errors="ignore")
    texts = dict(rows)

    def night(*extra: str) -> dict[str, str]:
        """Run; check every vector against the fake's for the text it embedded; return
        ``{id: text_sha256}`` of the run (the latest)."""
        from tasks.load.read_run import read_embeddings

        fake_openai.reset()
        code, out, err = _run(tmp_path, fake_openai, *extra)
        assert code == 0, out + err
        frame = read_embeddings(str(tmp_path / "out"))
        assert sorted(frame["id"]) == sorted(texts)
        for row_id, vector in zip(frame["id"], frame["embedding"], strict=True):
            embedded = cut if row_id == rows[1][0] and extra else texts[row_id]
            np.testing.assert_allclose(vector, expected_vector(embedded), atol=1e-6)
        return dict(zip(frame["id"], frame["text_sha256"], strict=True))

    hashes = night(*truncate)
    assert fake_openai.counters()["inputs"] == 6
    assert hashes[rows[1][0]] == hashlib.sha256(cut.encode()).hexdigest()
    hashes = night()  # the limit lifted: only the cut text is sent again, whole
    assert fake_openai.counters()["inputs"] == 1
    assert hashes[rows[1][0]] == hashlib.sha256(long_text.encode()).hexdigest()
    rows[3] = (rows[3][0], "an edited description")
    texts = dict(rows)
    _csv(tmp_path / "in.csv", rows)
    night(*truncate)  # the limit again: the cut text's vector is reused, the edit sent
    assert fake_openai.counters()["inputs"] == 1


def test_second_run_publishes_a_change_set_against_the_first(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    import pyarrow.parquet as pq

    rows = _rows(12)
    _csv(tmp_path / "in.csv", rows)
    code, out, err = _run(tmp_path, fake_openai, "--chunk-size", "5")
    assert code == 0, err
    first = read_local_output(tmp_path / "out")[0]
    assert first["format"] == "embedline.manifest.v2"
    assert first["changes"]["added"] == 12 and first["changes"]["base_run_key"] is None
    assert "changes    12 added, 0 changed, 0 removed, 0 unchanged (first run" in out
    edited = [r for r in rows if r[0] != "004"]
    edited[7] = (edited[7][0], "a new text")
    edited.append(("new", "appended row"))
    _csv(tmp_path / "in.csv", edited)
    fake_openai.reset()
    code, out, err = _run(
        tmp_path, fake_openai, "--chunk-size", "5", "--price-per-million-tokens", "0.02"
    )
    assert code == 0, err
    # a delta night: the 10 unchanged rows stay in the first run's objects (inherited, not
    # copied), the 2 new texts are sent
    assert fake_openai.counters()["inputs"] == 2
    assert "2 inputs charged" in out
    assert "rows       12 published of 12 (10 already published before)" in out
    assert "reuse      0 rows reused from earlier runs, 0 deduplicated in this run" in out
    tokens = int(re.search(r"inputs charged, ([\d,]+) tokens reported", out)[1].replace(",", ""))
    assert tokens > 0
    assert f"cost       ${tokens * 0.02 / 1e6:,.4f} estimated (at $0.02/1M tokens)" in out
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "out/manifests").glob("*.json")]
    second = next(m for m in manifests if m["run_key"] != first["run_key"])
    changes = second["changes"]
    assert changes["base_run_key"] == first["run_key"]
    assert (changes["added"], changes["changed"], changes["removed"], changes["unchanged"]) == (
        1,
        1,
        1,
        10,
    )
    table = pq.read_table(tmp_path / "out" / changes["object"]).to_pylist()
    assert table == [
        {
            "id": "004",
            "change": "removed",
            "text_sha256": keys.text_sha256(rows[4][1]),
            "text_changed": None,
        },
        {
            "id": edited[7][0],
            "change": "changed",
            "text_sha256": keys.text_sha256("a new text"),
            "text_changed": True,
        },
        {
            "id": "new",
            "change": "added",
            "text_sha256": keys.text_sha256("appended row"),
            "text_changed": None,
        },
    ]
    assert (
        f"changes    1 added, 1 changed, 1 removed, 10 unchanged (against run "
        f"{first['run_key'][:12]})" in out
    )
