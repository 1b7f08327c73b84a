"""``--rpm`` and ``--tpm`` hold across the workers of a Dask cluster: one budget on the
scheduler (tasks/embed/cluster_budget.py), against a fake server that enforces the same
limit and answers 429 past it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_vector
from tests.support.fixtures import run_cli
from tests.support.output import read_local_output
from tests.support.rate_window import RateWindow

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

#: 5 requests a second: 60 requests of 2 rows take 12 s. Each request is 6 tokens as the
#: fake counts them (3 words a text), 10 as embedline estimates them before the answer's
#: ``usage`` corrects it: 1,800 TPM is 5 requests a second too.
LIMITS = {"rpm": 300, "tpm": 1800}


# the TPM budget books estimated tokens, corrected by usage: its own path, run by
# `make test-all` (CI's 20 minutes hold the RPM case, the same budget and round trip)
@pytest.mark.parametrize("limit", ["rpm", pytest.param("tpm", marks=pytest.mark.slow)])
def test_two_workers_share_one_budget(
    tmp_path: Path, fake_openai: FakeEmbeddingServer, limit: str
) -> None:
    """Before, each worker paced itself to ``--rpm``: two workers sent twice the limit and
    the provider answered 429s from the first seconds."""
    per_minute = LIMITS[limit]
    window = RateWindow(**{limit: per_minute})  # a bucket of one second's worth
    fake_openai.fail_when(window)
    rows = [(f"b{i:03d}", f"budget text {i}") for i in range(120)]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"{a},{b}\n" for a, b in rows))
    result = run_cli(
        "run",
        "in.csv",
        "--embedder",
        "openai",
        "--base-url",
        fake_openai.base_url,
        "--output",
        "out",
        "--ledger",
        "ledger.sqlite3",
        "--chunk-size",
        "10",
        "--batch-size",
        "2",
        "--concurrency",
        "4",
        f"--{limit}",
        str(per_minute),
        "--task-runner",
        "dask",
        "--dask-workers",
        "2",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = [entry["status"] for entry in fake_openai.log]
    assert window.refused == 0 and 429 not in statuses, statuses
    assert len(window.accepted_at) == 60
    rate = window.rate_per_minute(skip_s=1.0, tokens=limit == "tpm")
    assert rate >= 0.9 * per_minute, rate  # the budget is used, not only kept
    assert rate <= 1.05 * per_minute, rate
    _, vectors = read_local_output(tmp_path / "out")
    for row_id, text in rows:
        np.testing.assert_allclose(vectors[row_id], expected_vector(text), rtol=1e-6)
    charged = fake_openai.charged_texts()
    assert len(charged) == len(rows) and set(charged.values()) == {1}  # each text paid once
