"""The reuse stage's copy (flow process): read each source object once, route its vectors to
the chunks that reuse them.

``tasks.reuse.row_sources.join_run`` lists, per source object (a chunk object of an earlier run or
a request this run kept), which of its rows fill which chunk rows. Here each source is read
exactly once per run — only its ``text_sha256`` and ``embedding`` columns (ranged reads on
S3), ``READERS`` at a time with at most ``BUDGET_BYTES`` of vectors in flight — and the
needed rows are taken by position and appended, with the source's full text hash, to the
target chunk's file in the run's scratch directory (``VECTOR_DTYPE``). A chunk then reads
its own file (``Prefill``) and compares each row's full SHA-256 with the one copied: a
64-bit prefix collision or an object rewritten since it was indexed costs a request, never
a wrong vector.

Vectors must all have the run's length (``length``; when it is unknown, the first source
read sets it): rows of a source of another length are not copied, so they are sent. A source
that is gone (gc) or unreadable is skipped the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adapters.scratch import Spill, digests, stable_order
from embedline.errors import EmbedlineError
from embedline.models import Row
from embedline.protocols import ObjectStore
from tasks.reuse.row_sources import JoinResult, Source

__all__ = ["BUDGET_BYTES", "READERS", "Gathered", "Prefill", "gather", "vector_dtype"]

logger = logging.getLogger("embedline")

#: Source objects read at once (threads: S3 ranged reads wait on the network).
READERS = 8
#: Bytes of source vectors in flight at most (read, not yet routed).
BUDGET_BYTES = 64 << 20
_ROUTE_BUFFER_BYTES = 32 << 20


def vector_dtype(width: int) -> np.dtype:
    """One copied row: its position in the chunk, the source's text SHA-256 (32 raw bytes)
    and the vector (``width`` float32)."""
    return np.dtype([("position", "<u4"), ("sha256", "u1", (32,)), ("vector", "<f4", (width,))])


@dataclass(slots=True)
class Gathered:
    """What ``gather`` copied: per-chunk files under ``directory`` (``{chunk}.bin`` of
    ``vector_dtype(width)``), rows copied per chunk index, and what it read."""

    directory: Path
    width: int | None
    copied: np.ndarray  # rows per chunk index (int64)
    sources_read: int = 0
    rows: int = 0
    seconds: float = 0.0

    def file(self, chunk: int) -> str | None:
        """The path of chunk ``chunk``'s copied vectors, or None if none were copied."""
        if self.width is None or not self.copied[chunk]:
            return None
        return str(self.directory / f"{chunk}.bin")


class Prefill:
    """A chunk's copied vectors, read from its ``Gathered`` file (``path``) or that file's
    bytes (``data``): ``take(rows)`` returns ``{row_number: vector}`` for the rows whose
    full text hash matches the copy."""

    def __init__(self, width: int, *, path: str | None = None, data: bytes | None = None) -> None:
        dtype = vector_dtype(width)
        self.records = (
            np.frombuffer(data, dtype=dtype)
            if data is not None
            else np.fromfile(str(path), dtype=dtype)
        )

    def take(self, rows: Sequence[Row]) -> dict[int, np.ndarray]:
        """Vectors (float32 ``(width,)``) by ``Row.row_number`` for ``rows`` (the chunk's
        rows in order, ``Row``), checked against each row's ``text_sha256``."""
        records = self.records[self.records["position"] < len(rows)]
        positions = records["position"].astype(np.int64)
        expected = bytes.fromhex("".join(rows[p].text_sha256 for p in positions))
        same = (records["sha256"] == np.frombuffer(expected, dtype=np.uint8).reshape(-1, 32)).all(
            axis=1
        )
        return {
            rows[int(p)].row_number: v
            for p, v in zip(positions[same], records["vector"][same], strict=True)
        }


def gather(
    store: ObjectStore,
    joined: JoinResult,
    directory: Path,
    *,
    length: int | None,
    chunks_total: int,
) -> Gathered:
    """Copy every planned row's vector into its chunk's file under ``directory``/vectors
    (module docstring).

    :raises DiskFullError: the scratch filesystem is full.
    :raises RetryableError, FatalError: the store failed (not a missing object).
    """
    started = time.monotonic()
    out = Gathered(directory / "vectors", length, np.zeros(chunks_total, dtype=np.int64))
    spill: Spill | None = None
    with ThreadPoolExecutor(READERS) as pool:
        for _number, needs, table in _read_each_once(pool, store, joined):
            out.sources_read += 1
            if table is None:
                continue
            width = table["embedding"].type.list_size
            if out.width is None:
                out.width = width
            if width != out.width:
                continue  # another length: these rows are sent
            if spill is None:
                dtype = vector_dtype(out.width)
                spill = Spill(
                    out.directory,
                    dtype,
                    buffer_rows=max(1024, _ROUTE_BUFFER_BYTES // dtype.itemsize),
                )
            copied = _route(spill, needs, table, out.width)
            np.add.at(out.copied, copied["chunk"].astype(np.int64), 1)
            out.rows += len(copied)
    if spill is not None:
        spill.flush()
    out.seconds = time.monotonic() - started
    return out


def _route(spill: Spill, needs: np.ndarray, table: pa.Table, width: int) -> np.ndarray:
    """Append the needed rows of one source to their chunks' files; return the needs kept
    (those whose source row exists and carries the expected hash prefix)."""
    hashes = table["text_sha256"].combine_chunks()
    flat = table["embedding"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
    vectors = flat.reshape(-1, width)
    at = needs["source_position"].astype(np.int64)
    needs = needs[at < len(vectors)]
    at = at[at < len(vectors)]
    raw = digests(hashes.take(pa.array(at)))  # (n, 32) uint8
    same = raw[:, :8].copy().view(">u8").ravel() == needs["prefix"]
    if not same.all():  # a prefix shared with another text: that row is sent instead
        needs, at, raw = needs[same], at[same], raw[same]
    done = 0
    while done < len(needs):  # straight into the spill's buffer: no array of our own
        records = spill.reserve(len(needs) - done)
        part = slice(done, done + len(records))
        records["position"] = needs["position"][part]
        records["sha256"] = raw[part]
        np.take(vectors, at[part], axis=0, out=records["vector"], mode="clip")  # at < len
        spill.commit(len(records), needs["chunk"][part].astype(np.int64))
        done = part.stop
    return needs


def _read_each_once(
    pool: ThreadPoolExecutor, store: ObjectStore, joined: JoinResult
) -> Iterator[tuple[int, np.ndarray, pa.Table | None]]:
    """``(source number, its needs, its table or None)`` for every source with needs, each
    read once, in source order; reads overlap up to ``READERS`` and ``BUDGET_BYTES``."""
    pending: list[tuple[int, np.ndarray, Future[pa.Table | None], int]] = []
    in_flight = 0
    for number, needs in _needs_by_source(joined):
        source = joined.sources[number]
        cost = max(source.rows, len(needs)) * 1536 * 4  # bytes, before the width is known
        while pending and (len(pending) >= READERS or in_flight + cost > BUDGET_BYTES):
            done = pending.pop(0)
            in_flight -= done[3]
            yield done[0], done[1], done[2].result()
        pending.append((number, needs, pool.submit(_read_source, store, source), cost))
        in_flight += cost
    for number, needs, future, _ in pending:
        yield number, needs, future.result()


def _needs_by_source(joined: JoinResult) -> Iterator[tuple[int, np.ndarray]]:
    for part in joined.needs.partitions():
        needs = joined.needs.read(part)
        needs = needs[stable_order(needs["source"])]
        cut = np.flatnonzero(np.diff(needs["source"])) + 1
        for group in np.split(needs, cut):
            if len(group):
                yield int(group["source"][0]), group
        joined.needs.drop(part)


def _read_source(store: ObjectStore, source: Source) -> pa.Table | None:
    """The ``text_sha256`` and ``embedding`` columns of a source, or None if it is gone or
    not readable as one (its rows are then sent)."""
    try:
        with store.open_read(source.key) as fh:
            return pq.ParquetFile(fh).read(columns=["text_sha256", "embedding"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, pa.ArrowException) as exc:
        logger.warning(
            "not reusing rows of %s, which cannot be read: %s", source.key, type(exc).__name__
        )
        return None
    except EmbedlineError:
        raise
