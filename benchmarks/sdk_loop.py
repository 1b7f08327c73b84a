"""The baseline embedline's end-to-end time is compared with: the openai SDK in a loop.

What a user writes without embedline: read the CSV with pandas, send batches of 1,000 texts
with the official ``openai`` client from 4 threads, write one Parquet file. No resume, no
ledger, no exactly-once. Empty texts are skipped (embedline never sends them either).
Run as its own process by ``bench_cli.py``, so its wall time includes imports, as the CLI's
does::

    python benchmarks/sdk_loop.py DATA BASE_URL OUT.parquet
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

BATCH, THREADS, MODEL = 1000, 4, "text-embedding-3-small"


def main(data: str, base_url: str, out: str) -> int:
    """Embed ``data``'s ``text`` column; write ``id``/``embedding`` to ``out``; print rows."""
    import numpy as np
    import openai
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = pd.read_csv(data, dtype=str, keep_default_na=False)
    frame = frame[frame["text"].str.strip() != ""]
    client = openai.OpenAI(api_key="unused", base_url=base_url, max_retries=6)
    texts = frame["text"].tolist()
    batches = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]

    def embed(batch: list[str]) -> np.ndarray:
        response = client.embeddings.create(model=MODEL, input=batch)
        return np.asarray([d.embedding for d in response.data], dtype=np.float32)

    with ThreadPoolExecutor(THREADS) as pool:
        vectors = np.concatenate(list(pool.map(embed, batches)))
    dims = vectors.shape[1]
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dims)
    pq.write_table(pa.table({"id": frame["id"].tolist(), "embedding": embedding}), out)
    print(len(vectors))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
