"""``embedline gc`` and the ``gc-output`` flow on real runs: what goes, what stays, and a run
in progress on the same output that must not be hurt."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.ledger import Ledger
from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import REPO, run_cli
from tests.support.forked_cli import popen_cli
from tests.support.in_process import run_in_process
from tests.support.moto_server import make_s3_client
from tests.support.output import vectors_by_id

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

Rows = list[tuple[str, str]]
TWO_DAYS_S = 2 * 86400


def _rows(n: int, tag: str = "") -> Rows:
    return [(f"id{i:03d}", f"package {i} description{tag}") for i in range(n)]


def _write(path: Path, rows: Rows) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([("id", "text"), *rows])
    path.write_text(buf.getvalue())


def _args(tmp: Path, server: FakeEmbeddingServer, output: str) -> list[str]:
    return [
        "run",
        str(tmp / "in.csv"),
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        output,
        "--ledger",
        str(tmp / "ledger.sqlite3"),
        "--chunk-size",
        "10",
    ]


def _run(
    tmp: Path,
    server: FakeEmbeddingServer,
    output: str,
    rows: Rows,
    api_url: str,
    source: str = "in.csv",
    **params: Any,
) -> str:
    """Publish ``rows`` (written to ``source`` unless None) in process, as ``_args`` would
    with the CLI (the runs are gc's preconditions); return the manifest's URI."""
    if source == "in.csv":
        _write(tmp / source, rows)
    return str(
        run_in_process(
            api_url,
            input=str(tmp / source),
            embedder="openai",
            base_url=server.base_url,
            output=output,
            ledger=str(tmp / "ledger.sqlite3"),
            chunk_size=10,
            **params,
        )["manifest_uri"]
    )


def _age(root: Path, seconds: float) -> None:
    """Make every file under ``root`` look ``seconds`` old (mtime is gc's clock)."""
    then = time.time() - seconds
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


def _check(manifest: dict[str, Any], bodies: dict[str, bytes], rows: Rows) -> None:
    vectors = vectors_by_id(bodies, manifest)
    assert sorted(vectors) == sorted(i for i, _ in rows)
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)


def _local_check(out: Path, manifest_path: str, rows: Rows) -> None:
    manifest = json.loads(Path(manifest_path).read_text())
    _check(
        manifest, {e["object"]: (out / e["object"]).read_bytes() for e in manifest["chunks"]}, rows
    )


def _gc(tmp: Path, out: Path, *flags: str) -> str:
    result = run_cli("gc", str(out), "--ledger", str(tmp / "ledger.sqlite3"), *flags, cwd=tmp)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_gc_keeps_what_kept_runs_and_a_run_in_progress_need(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    out = tmp_path / "out"
    first = _rows(60)
    manifest_a = _run(tmp_path, fake_openai, str(out), first, prefect_api_url)
    second = [*(_rows(10, " v2")), *first[10:]]  # chunk 0 edited
    manifest_b = _run(tmp_path, fake_openai, str(out), second, prefect_api_url)
    a = json.loads(Path(manifest_a).read_text())
    only_a = a["chunks"][0]["object"]
    _age(out, TWO_DAYS_S)

    dry = _gc(tmp_path, out, "--keep-runs", "1", "--dry-run")
    assert "manifests  would delete 1 object," in dry
    assert "chunks     would delete 1 object," in dry
    assert "changes    would delete 1 object," in dry
    assert Path(manifest_a).exists() and (out / only_a).exists()

    # A run in progress that needs chunk 0 of the first run (no kept manifest lists it):
    # its requests are slow, so gc runs while it holds its lease.
    fake_openai.fail_when(lambda payload: {"delay_s": 4.0})
    third = [*first, ("id999", "a new package")]
    _write(tmp_path / "in.csv", third)
    running = popen_cli(
        [sys.executable, "-m", "cli", *_args(tmp_path, fake_openai, str(out))],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list((out / "_embedline" / "runs").glob("*.json")):
            assert time.monotonic() < deadline and running.poll() is None, "no run lease seen"
            time.sleep(0.1)
        done = _gc(tmp_path, out, "--keep-runs", "1", "--grace", "1h")
        stdout, stderr = running.communicate(timeout=120)
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 0, stderr[-3000:]
    assert "manifests  deleted 1 object," in done and "changes    deleted 1 object," in done
    assert "chunks     deleted 0 objects" in done  # the running run's lease kept chunk 0
    # and the report says so (it read "kept 1 runs" alone, found by a break test)
    assert "kept       1 run, and 1 object that runs in progress need (live leases)" in done
    assert not Path(manifest_a).exists() and (out / only_a).exists()
    manifest_c = next(
        line.split()[-1] for line in stdout.splitlines() if line.startswith("manifest")
    )
    _local_check(out, manifest_c, third)
    _local_check(out, manifest_b, second)
    assert not list((out / "_embedline" / "runs").glob("*.json"))  # the lease went with it

    # Once nothing needs it any more (only the newest run, by created_at, is kept), the
    # second run's own chunk goes, and the ledger forgets it: a later run that needs it
    # embeds it again instead of skipping it or reusing a vector that is gone.
    b_only = json.loads(Path(manifest_b).read_text())["chunks"][0]["object"]
    _age(out, TWO_DAYS_S)
    _gc(tmp_path, out, "--keep-runs", "1")
    assert not (out / b_only).exists() and not Path(manifest_b).exists()
    assert (out / only_a).exists()  # the newest (third) run lists it
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    assert ledger.published_object(str(out / b_only)) is None
    assert b_only not in ledger.indexed_objects(str(out))
    ledger.close()
    fake_openai.fail_when(None)
    fake_openai.reset()
    # 10 rows of the newest run's 61: the mass-delete guard would stop it (that is not
    # what this test is about)
    again = _run(
        tmp_path, fake_openai, str(out), second[:10], prefect_api_url, max_delete_fraction=1.0
    )
    assert fake_openai.counters()["inputs"] == 10
    _local_check(out, again, second[:10])


def test_gc_output_flow_on_s3_keeps_the_newest_run(
    tmp_path: Path,
    fake_openai: FakeEmbeddingServer,
    moto_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    prefect_api_url: str,
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.gc_output import gc_output

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)  # the runs and gc, in process
    output = f"s3://{s3_bucket}/emb"
    first = _rows(30)
    _run(tmp_path, fake_openai, output, first, prefect_api_url)
    second = [*(_rows(10, " v2")), *first[10:]]
    uri_b = _run(tmp_path, fake_openai, output, second, prefect_api_url)
    s3 = make_s3_client(moto_endpoint)

    def keys() -> set[str]:
        listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="emb/")["Contents"]
        return {o["Key"][4:] for o in listed}

    before = keys()
    with temporary_settings(updates={PREFECT_API_URL: prefect_api_url}):
        dry = gc_output(
            output=output,
            keep_runs=1,
            grace="0s",
            dry_run=True,
            ledger=str(tmp_path / "ledger.sqlite3"),
        )
        assert {k: v["objects"] for k, v in dry["deleted"].items()} == {
            "manifests": 1,
            "chunks": 1,
            "changes": 1,
            "stale": 0,
        }
        assert keys() == before
        done = gc_output(
            output=output, keep_runs=1, grace="0s", ledger=str(tmp_path / "ledger.sqlite3")
        )
    assert done["deleted"] == dry["deleted"] and done["kept_runs"] == [uri_b.rsplit("/")[-1][:-5]]
    assert len(before - keys()) == 3
    manifest = json.loads(
        s3.get_object(Bucket=s3_bucket, Key=uri_b[len(f"s3://{s3_bucket}/") :])["Body"].read()
    )
    bodies = {
        e["object"]: s3.get_object(Bucket=s3_bucket, Key=f"emb/{e['object']}")["Body"].read()
        for e in manifest["chunks"]
    }
    _check(manifest, bodies, second)


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state ``T`` in ``/proc/PID/stat``."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _wait_until_stopped(proc: subprocess.Popen[str], what: str, timeout_s: float = 120) -> None:
    """Wait until ``proc`` stopped itself (``tests/support/signal_at``'s SIGSTOP)."""
    deadline = time.monotonic() + timeout_s
    while not _stopped(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, f"the {what} never paused"
        time.sleep(0.05)


@pytest.mark.slow  # CI's 20-minute budget (docs: README, tests); make test-all runs it
def test_gc_racing_a_load_rolling_back_keeps_the_run_and_the_load_completes(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    import lancedb

    out = tmp_path / "out"
    old_rows, new_rows = _rows(40), _rows(40, " v2")  # every chunk differs between the runs
    old = Path(_run(tmp_path, fake_openai, str(out), old_rows, prefect_api_url)).stem
    new = Path(_run(tmp_path, fake_openai, str(out), new_rows, prefect_api_url)).stem
    sink = f"lancedb://{tmp_path}/lance?table=docs"
    load = [
        "load",
        "--to",
        sink,
        "--output",
        str(out),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
    ]
    first = run_cli(*load, new, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]

    # Roll the sink back to the older run; the load stops itself after its first chunk is
    # recorded (SIGSTOP), and gc runs with no grace period and only the newest run kept.
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'tests/support/signal_at'}:{REPO}",
        "EMBEDLINE_TEST_SIGNALS": "after:adapters.ledger:Ledger.mark_chunk_loaded:SIGSTOP",
    }
    loading = popen_cli(
        [sys.executable, "-m", "cli", *load, old],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_stopped(loading, "load")
        done = _gc(tmp_path, out, "--keep-runs", "1", "--grace", "0s")
        loading.send_signal(signal.SIGCONT)
        _stdout, stderr = loading.communicate(timeout=120)
    finally:
        if loading.poll() is None:
            loading.kill()
            loading.wait()
    assert "manifests  deleted 0 objects" in done and "chunks     deleted 0 objects" in done
    assert "kept 2 runs, deleted 0" in done  # the loading run counts as kept
    assert loading.returncode == 0, stderr[-3000:]
    assert (out / "manifests" / f"{old}.json").exists()
    assert not list((out / "_embedline" / "loads").glob("*.json"))  # the lease went with it
    table = lancedb.connect(str(tmp_path / "lance")).open_table("docs").to_arrow()
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(i for i, _ in old_rows)  # the sink equals the older run
    vectors = dict(zip(ids, table.column("embedding").to_pylist(), strict=True))
    for row_id, text in old_rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)

    # The load over, nothing protects the older run any more: the next gc deletes it.
    after = _gc(tmp_path, out, "--keep-runs", "1", "--grace", "0s")
    assert "manifests  deleted 1 object," in after
    assert not (out / "manifests" / f"{old}.json").exists()


def test_gc_keep_runs_1_keeps_the_newest_run_of_each_dataset(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    out = tmp_path / "out"
    rows = _rows(20)
    _write(tmp_path / "in.csv", rows)
    with_title = tmp_path / "titled.csv"
    with_title.write_text("id,text,title\n" + "".join(f"{i},{t},title {i}\n" for i, t in rows))
    datasets = {  # three datasets, two runs of the first
        "text-old": ("in.csv", {}),
        "text-new": ("titled.csv", {}),
        "title": ("titled.csv", {"text_column": "title"}),
        "model": ("in.csv", {"model": "other-model"}),
    }
    manifests = {
        name: _run(tmp_path, fake_openai, str(out), rows, prefect_api_url, source=source, **params)
        for name, (source, params) in datasets.items()
    }
    _age(out, TWO_DAYS_S)

    report = _gc(tmp_path, out, "--keep-runs", "1")
    assert not Path(manifests["text-old"]).exists()
    for name in ("text-new", "title", "model"):
        manifest = json.loads(Path(manifests[name]).read_text())
        assert all((out / e["object"]).exists() for e in manifest["chunks"]), name
    assert "kept       3 runs" in report and "manifests  deleted 1 object," in report
    assert "text_column=text model=" in report and "kept 1 run, deleted 1" in report
    assert "text_column=title" in report and "model=other-model" in report
    assert "package 1 description" not in report  # names and counts only, never text


def test_gc_with_no_grace_keeps_what_a_paused_run_holds_and_its_paid_requests(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, prefect_api_url: str
) -> None:
    """A run in progress is protected by its lease whatever ``--grace``: the lease carries
    ``expires_at`` and is renewed while the run runs. Before, the run lease had none, so
    ``gc --grace 0s`` took it for a dead run's and deleted it with the chunk objects the
    run was about to commit and the requests it had already paid for."""
    out = tmp_path / "out"
    rows = _rows(20)  # two chunks of 10, two requests of 5 each
    _write(tmp_path / "in.csv", rows)
    fake_openai.fail_when(
        lambda payload: (
            {"status": 503}
            if any(t == "package 17 description" for t in payload["input"])
            else None
        )
    )
    first = run_in_process(
        prefect_api_url,
        expect=1,
        input=str(tmp_path / "in.csv"),
        embedder="openai",
        base_url=fake_openai.base_url,
        output=str(out),
        ledger=str(tmp_path / "ledger.sqlite3"),
        chunk_size=10,
        batch_size=5,
        max_attempts=1,
        chunk_retries=0,
    )
    assert first["chunks_published"] == 1 and first["chunks_failed"] == 1, first
    paid = sorted((out / "_embedline" / "paid").rglob("*.parquet"))
    assert len(paid) == 1  # chunk 1's first request, kept
    chunk_0 = sorted((out / "chunks").glob("*.parquet"))
    assert len(chunk_0) == 1
    _age(out, TWO_DAYS_S)  # what the first attempt left is old: only a lease protects it
    fake_openai.reset()

    # The rerun stops itself (SIGSTOP) as chunk 1 is about to take its paid request
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'tests/support/signal_at'}:{REPO}",
        "EMBEDLINE_TEST_SIGNALS": "before:tasks.embed.paid:take_paid:SIGSTOP",
    }
    args = [*_args(tmp_path, fake_openai, str(out)), "--batch-size", "5"]
    running = popen_cli(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_stopped(running, "run")
        done = _gc(tmp_path, out, "--grace", "0s")
        leases = list((out / "_embedline" / "runs").glob("*.json"))
        left_paid = sorted((out / "_embedline" / "paid").rglob("*.parquet"))
        running.send_signal(signal.SIGCONT)
        stdout, stderr = running.communicate(timeout=120)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    # the live run's leases stay: the flow's, and on a rerun the one the CLI took before
    # Prefect started and holds until the flow ends (no gap for gc between the two)
    assert leases and {p.name.split(".")[0] for p in leases} == {first["run_key"]}, done
    assert left_paid == paid, done  # and so do the requests it paid for
    assert all(p.exists() for p in chunk_0), done  # and the chunk objects it will commit
    assert "chunks     deleted 0 objects" in done, done
    assert running.returncode == 0, stderr[-3000:]
    assert fake_openai.counters()["inputs"] == 5  # only what chunk 1 never got an answer for
    manifest = next(line.split()[-1] for line in stdout.splitlines() if line.startswith("manifest"))
    _local_check(out, manifest, rows)
    assert not list((out / "_embedline" / "runs").glob("*.json"))  # dropped at the end
