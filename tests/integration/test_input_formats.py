"""``embedline run`` on files as users export them (issue 8, items 11-12), end to end: a real
CLI process, the loopback fake server, moto's S3 server; every vector checked against the
server's deterministic vector for its text."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import boto3
import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.output import read_local_output, vectors_by_id

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

ROWS = [(f"{i:03d}", f"Paket {i}: Größe, «quoted» and ünïcode — 日本語 {i}") for i in range(9)]


def _text(delimiter: str = ",", newline: str = "\n") -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, lineterminator=newline)
    writer.writerow(("id", "text"))
    writer.writerows(ROWS)
    return buf.getvalue()


def _run(
    tmp_path: Path,
    server: FakeEmbeddingServer,
    source: str,
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
) -> tuple[int, str]:
    result = run_cli(
        "run",
        source,
        "--embedder",
        "openai",
        "--base-url",
        server.base_url,
        "--output",
        str(tmp_path / "out"),
        "--ledger",
        str(tmp_path / "ledger.sqlite3"),
        "--chunk-size",
        "4",
        *extra,
        cwd=tmp_path,
        env=env,
    )
    return result.returncode, result.stdout + result.stderr


def _check(tmp_path: Path) -> None:
    _, vectors = read_local_output(tmp_path / "out")
    assert set(vectors) == {i for i, _ in ROWS}
    for row_id, text in ROWS:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), atol=1e-6)


def test_excel_unicode_text_utf16_tab_separated(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    path = tmp_path / "export.txt"
    path.write_bytes(codecs.BOM_UTF16_LE + _text("\t", "\r\n").encode("utf-16-le"))
    code, output = _run(tmp_path, fake_openai, str(path))
    assert code == 0, output
    assert "encoding utf-16-le (byte-order mark)" in output and "delimiter '\\t'" in output
    _check(tmp_path)


def test_semicolon_file_with_cr_only_line_ends(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    path = tmp_path / "mac.csv"
    path.write_bytes(_text(";", "\r").encode("utf-8"))
    code, output = _run(tmp_path, fake_openai, str(path))
    assert code == 0, output
    _check(tmp_path)


def test_cp932_file_is_detected_and_announced(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    rows = [
        (f"{i}", f"日本語のパッケージ説明です。番号{i}、とても便利なツールです。")
        for i in range(30)
    ]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerows([("id", "text"), *rows])
    (tmp_path / "sjis.csv").write_bytes(buf.getvalue().encode("cp932"))
    code, output = _run(tmp_path, fake_openai, str(tmp_path / "sjis.csv"))
    assert code == 0, output
    assert "charset-normalizer" in output
    _, vectors = read_local_output(tmp_path / "out")
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), atol=1e-6)


def _run_gzip_local_and_on_s3(
    tmp_path: Path,
    fake: FakeEmbeddingServer,
    moto_endpoint: str,
    bucket: str,
    packed: bytes,
    key: str,
) -> Path:
    """Run ``packed`` (gzip bytes) from a local file and from ``s3://bucket/key``; both must
    exit 0 with every vector right. Returns the S3 run's directory (its output in ``out``)."""
    (tmp_path / "in.csv.gz").write_bytes(packed)
    code, output = _run(tmp_path, fake, str(tmp_path / "in.csv.gz"))
    assert code == 0, output
    _check(tmp_path)
    boto3.client("s3", endpoint_url=moto_endpoint).put_object(Bucket=bucket, Key=key, Body=packed)
    remote = tmp_path / "remote"
    remote.mkdir()
    code, output = _run(
        remote, fake, f"s3://{bucket}/{key}", env={"AWS_ENDPOINT_URL": moto_endpoint}
    )
    assert code == 0, output
    _check(remote)
    return remote


def test_gzip_input_local_and_on_s3_streamed(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    packed = gzip.compress(_text().encode("utf-8"))
    remote = _run_gzip_local_and_on_s3(
        tmp_path, fake_openai, moto_endpoint, s3_bucket, packed, "inputs/data.csv.gz"
    )
    manifest, _ = read_local_output(remote / "out")
    assert manifest["input"]["name"] == "data.csv.gz"
    assert manifest["input"]["bytes"] == len(_text().encode("utf-8"))  # decompressed bytes


def test_an_xlsx_is_refused_naming_what_it_is(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    import zipfile

    with zipfile.ZipFile(tmp_path / "book.xlsx", "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    code, output = _run(tmp_path, fake_openai, str(tmp_path / "book.xlsx"))
    assert code == 2 and "ZIP archive" in output and fake_openai.requests == 0


def test_gzip_with_nul_padding_after_the_member_runs_local_and_on_s3(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    """Issue 22 item 8: 1,024 NUL bytes after the member (block devices, some uploaders),
    which ``zcat`` and Python's gzip read, were planned and then failed every chunk read."""
    packed = gzip.compress(_text().encode("utf-8")) + b"\0" * 1024
    _run_gzip_local_and_on_s3(
        tmp_path, fake_openai, moto_endpoint, s3_bucket, packed, "inputs/padded.csv.gz"
    )


def test_gzip_trailing_garbage_is_refused_at_planning_naming_the_offset(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    member = gzip.compress(_text().encode("utf-8"))
    (tmp_path / "in.csv.gz").write_bytes(member + b"\0" * 8 + b"<html>oops</html>\n")
    code, output = _run(tmp_path, fake_openai, str(tmp_path / "in.csv.gz"))
    assert code == 2, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if f"byte offset {len(member) + 8}" in line]
    assert len(lines) == 1 and "in.csv.gz" in lines[0], output
    assert fake_openai.requests == 0


#: A plain TSV as databases and PyPI dumps deliver it: quotes are characters of the text.
LITERAL_ROWS = [
    ("1", '"Quoted" name at the start of a summary'),
    ("2", '"a well-formed quoted field keeps its quotes"'),
    ("3", 'an unbalanced " quote, then a comma'),
    ("4", 'doubled ""quotes"" stay doubled'),
    ("5", "plain text"),
    ("6", '"'),
]


def test_a_tsv_with_literal_quotes_reads_as_delivered_with_quoting_none(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, moto_endpoint: str, s3_bucket: str
) -> None:
    data = "".join(f"{i}\t{t}\n" for i, t in [("id", "text"), *LITERAL_ROWS]).encode()
    (tmp_path / "dump.tsv").write_bytes(data)
    before = fake_openai.counters()["requests"]
    code, output = _run(tmp_path, fake_openai, str(tmp_path / "dump.tsv"))
    assert code == 2 and "pass --quoting none" in output and "dump.tsv:2" in output, output
    assert fake_openai.counters()["requests"] == before  # refused before any request

    def check(where: Path) -> None:
        _, vectors = read_local_output(where / "out")
        assert set(vectors) == {i for i, _ in LITERAL_ROWS}
        for row_id, text in LITERAL_ROWS:
            np.testing.assert_allclose(vectors[row_id], expected_vector(text), atol=1e-6)

    code, output = _run(
        tmp_path, fake_openai, str(tmp_path / "dump.tsv"), extra=["--quoting", "none"]
    )
    assert code == 0, output
    check(tmp_path)
    # gzip on S3: the same readers, streamed
    boto3.client("s3", endpoint_url=moto_endpoint).put_object(
        Bucket=s3_bucket, Key="inputs/dump.tsv.gz", Body=gzip.compress(data)
    )
    remote = tmp_path / "remote"
    remote.mkdir()
    code, output = _run(
        remote,
        fake_openai,
        f"s3://{s3_bucket}/inputs/dump.tsv.gz",
        env={"AWS_ENDPOINT_URL": moto_endpoint},
        extra=["--quoting", "none"],
    )
    assert code == 0, output
    check(remote)


def test_the_same_texts_in_nfd_and_nfc_are_paid_once_with_normalize_nfc(
    tmp_path: Path, fake_openai: FakeEmbeddingServer
) -> None:
    texts = [f"café crème brûlée, Ångström №{i}" for i in range(6)]
    for form in ("NFD", "NFC"):
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(
            [
                ("id", "text"),
                *((str(i), unicodedata.normalize(form, t)) for i, t in enumerate(texts)),
            ]
        )
        (tmp_path / f"{form}.csv").write_text(buf.getvalue(), encoding="utf-8")
    inputs = fake_openai.counters()["inputs"]
    code, output = _run(
        tmp_path, fake_openai, str(tmp_path / "NFD.csv"), extra=["--normalize", "NFC"]
    )
    assert code == 0, output
    assert fake_openai.counters()["inputs"] - inputs == len(texts)
    code, output = _run(
        tmp_path, fake_openai, str(tmp_path / "NFC.csv"), extra=["--normalize", "NFC"]
    )
    assert code == 0, output
    assert fake_openai.counters()["inputs"] - inputs == len(texts)  # paid once
    manifests = sorted((tmp_path / "out" / "manifests").glob("*.json"))
    assert len(manifests) == 2  # two inputs (other bytes): two runs, the same chunks
    for path in manifests:
        manifest = json.loads(path.read_text())
        bodies = {
            e["object"]: (tmp_path / "out" / e["object"]).read_bytes() for e in manifest["chunks"]
        }
        vectors = vectors_by_id(bodies, manifest)
        for i, text in enumerate(texts):
            np.testing.assert_allclose(vectors[str(i)], expected_vector(text), atol=1e-6)
