"""Helpers for tests that plan small CSVs and publish their chunks with the fake server's
vectors (``fake_openai.expected_matrix``: an independent truth), and count a store's reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from adapters.csv_chunks import read_chunk
from adapters.csv_source import plan_csv
from embedline.keys import row_key
from embedline.models import ChunkOutcome, InputPlan
from tasks.embed.rows import EmbeddedRows
from tasks.publish.chunk_object import publish_chunk
from tests.support.fake_openai import expected_matrix

__all__ = ["CountingStore", "plan_rows", "publish_truth"]


def plan_rows(
    tmp: Path,
    name: str,
    rows: list[tuple[Any, str]],
    chunk_size: int,
    *,
    model: str = "m",
    dimensions: int = 8,
) -> InputPlan:
    """Write ``rows`` (id, text) as ``tmp/name`` and plan it with a scratch directory."""
    path = tmp / name
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows), encoding="utf-8")
    return plan_csv(
        path,
        id_column="id",
        text_column="text",
        codec="auto",
        chunk_size=chunk_size,
        model=model,
        dimensions=dimensions,
        delimiter="auto",
        scratch_root=str(tmp),
    )


def publish_truth(
    store: Any, plan: InputPlan, *, model: str = "m", dimensions: int = 8
) -> dict[int, ChunkOutcome]:
    """Publish every chunk of ``plan`` with the server's vectors for its texts."""
    done = {}
    for spec in plan.chunks:
        rows = read_chunk(plan.source, spec)
        embedded = EmbeddedRows(
            rows,
            expected_matrix([r.text for r in rows], dimensions),
            [row_key(r.id, r.text_sha256, model, dimensions) for r in rows],
        )
        done[spec.index] = publish_chunk(store, spec, embedded, model=model, dimensions=dimensions)
    return done


class CountingStore:
    """A store that counts ``open_read`` per key (the store's reads), else delegates."""

    def __init__(self, store: Any) -> None:
        self._store, self.opened = store, Counter()

    def open_read(self, key: str) -> Any:
        self.opened[key] += 1
        return self._store.open_read(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
