"""``embedline recall TARGET [--queries 20] [--k 10] [--seed 0] [--where COLUMN=VALUE …]``:
how many of the true k nearest neighbours ``embedline search`` finds on TARGET.

An approximate index (pgvector's HNSW, a Qdrant server's graph) trades recall for speed, and
how much depends on the data: nothing but a measurement says it. The command samples
``--queries`` stored rows (``random.Random(seed).sample`` of the sorted ids: the same rows
for the same table and seed), searches with each one's stored vector twice, as ``search``
does and as ``search --exact`` does (with the same ``--where``), and prints one line::

    recall@10  0.870 over 20 queries: search found 174 of the 200 true nearest (search --exact)

The sampled row itself is left out of both lists (each asks for k + 1). A row the search
returns whose score ties the k-th true neighbour's (rows of equal text) counts as found.
No query is embedded: the stored vectors are the queries, so no embedder or key is needed.
An output root is always searched exactly: its recall is 1 by construction (the line says
so). Exit 0; a target without rows, or a ``--where`` column it lacks, exit 2.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cli.arguments import HELP_FORMATTER, positive_int
from cli.failures import EXIT_USAGE, fail

__all__ = ["Recall", "add_parsers", "found_of", "measure_recall", "sample_ids"]

DEFAULT_QUERIES = 20
TIE_TOLERANCE = 1e-6  # cosine similarity: a score this close to the k-th true one ties it


@dataclass(frozen=True, slots=True)
class Recall:
    """What ``measure_recall`` found: ``found`` of the ``true`` nearest neighbours (summed
    over ``queries`` queries) were among ``search``'s hits; ``exact_only`` when the target
    is always searched exactly (an output root)."""

    k: int
    queries: int
    found: int
    true: int
    exact_only: bool = False

    @property
    def value(self) -> float:
        """found / true (1.0 when no query had a neighbour)."""
        return self.found / self.true if self.true else 1.0

    def line(self) -> str:
        """The one line the command prints."""
        note = "an output root is always searched exactly" if self.exact_only else "search --exact"
        return (
            f"recall@{self.k}  {self.value:.3f} over {self.queries} queries: search found "
            f"{self.found} of the {self.true} true nearest ({note})"
        )


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``recall``."""
    from cli.search import _where

    recall = sub.add_parser(
        "recall",
        help="measure how many of the true k nearest `search` finds (its index against "
        "an exact scan, on sampled stored rows)",
        formatter_class=HELP_FORMATTER,
    )
    recall.add_argument(
        "target",
        metavar="TARGET",
        help="a sink URI (postgresql://…, qdrant://…, lancedb://…) or an output root",
    )
    recall.add_argument(
        "--queries",
        type=positive_int,
        default=DEFAULT_QUERIES,
        help="stored rows sampled as queries",
    )
    recall.add_argument("--k", type=positive_int, default=10, help="neighbours per query")
    recall.add_argument("--seed", type=int, default=0, help="the sample's random seed")
    recall.add_argument(
        "--run", default=None, help="with an output root: a run key or prefix (default: the latest)"
    )
    recall.add_argument(
        "--where",
        metavar="COLUMN=VALUE",
        action="append",
        type=_where,
        default=[],
        help="measure filtered search: both searches keep only rows whose COLUMN is VALUE",
    )
    recall.set_defaults(handler=_recall, resumable=False)


def sample_ids(ids: Sequence[str], n: int, seed: int) -> list[str]:
    """``n`` of ``ids`` (all when fewer): ``random.Random(seed).sample`` of them sorted, so
    the same table and seed give the same queries whatever order the store lists ids in."""
    ordered = sorted(ids)
    return random.Random(seed).sample(ordered, min(n, len(ordered)))


def found_of(
    hits: Sequence[tuple[Any, ...]], truth: Sequence[tuple[Any, ...]], query_id: str, k: int
) -> tuple[int, int]:
    """``(found, true)`` for one query: of the true nearest ``truth`` (``(id, score, …)``,
    best first, ``query_id`` left out, at most ``k``), how many ``hits`` (the same shape)
    holds, a hit tying the k-th true score counting as found."""
    truth = [t for t in truth if str(t[0]) != query_id][:k]
    hits = [h for h in hits if str(h[0]) != query_id][:k]
    if not truth:
        return 0, 0
    wanted = {str(t[0]) for t in truth}
    floor = float(truth[-1][1]) - TIE_TOLERANCE
    found = sum(1 for h in hits if str(h[0]) in wanted or float(h[1]) >= floor)
    return min(found, len(truth)), len(truth)


def measure_recall(
    target: str,
    *,
    queries: int = DEFAULT_QUERIES,
    k: int = 10,
    seed: int = 0,
    where: Sequence[tuple[str, str]] = (),
    run: str | None = None,
) -> Recall:
    """Measure ``search``'s recall@k on ``target`` (see the module docstring).

    :raises InputError: no rows, no table, or a ``where`` column the target lacks.
    """
    from cli.search import _is_sink

    if not _is_sink(target):
        return _output_root_recall(target, queries=queries, k=k, seed=seed, where=where, run=run)
    from adapters.sinks import open_sink
    from cli.search import _shown
    from embedline.errors import InputError

    sink = open_sink(target)
    try:
        info = sink.describe()
        if info is None or info.rows == 0:
            raise InputError(f"sink {sink.identity} has no rows to sample: load a run first")
        _shown(target, ("id", *info.columns.names), (), False, where)
        chosen = sample_ids(sink.held_keys().column("id").to_pylist(), queries, seed)
        vectors = sink.vectors(chosen)
        found = true = 0
        for row_id in chosen:
            vector = vectors[row_id]
            hits = sink.search(vector, k + 1, where=tuple(where))
            truth = sink.search(vector, k + 1, where=tuple(where), exact=True)
            got, wanted = found_of(hits, truth, row_id, k)
            found, true = found + got, true + wanted
        return Recall(k, len(chosen), found, true)
    finally:
        sink.close()


def _output_root_recall(
    target: str,
    *,
    queries: int,
    k: int,
    seed: int,
    where: Sequence[tuple[str, str]],
    run: str | None,
) -> Recall:
    """An output root's search is a scan: the hits are the truth. Counted all the same
    (the sample, the filter, the neighbours), so the line reads like a sink's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from adapters.sinks.base import exact_top_k, vector_matrix
    from cli.search import _shown
    from embedline.errors import InputError
    from tasks.load.read_run import read_embeddings_arrow

    table = read_embeddings_arrow(target, run)
    known = ("id", *(n for n in table.column_names if n not in ("id", "embedding", "text_sha256")))
    _shown(target, known, (), False, where)
    if table.num_rows == 0:
        raise InputError(f"{target} has no rows to sample")
    ids = table.column("id").to_pylist()
    chosen = sample_ids(ids, queries, seed)
    position = {row_id: n for n, row_id in enumerate(ids)}
    everything = vector_matrix(table)
    for name, value in where:
        table = table.filter(pc.equal(table.column(name), pa.scalar(value, pa.string())))
    matrix, kept = vector_matrix(table), table.column("id").to_pylist()
    found = true = 0
    for row_id in chosen:
        truth = exact_top_k(matrix, kept, everything[position[row_id]], k + 1)
        got, wanted = found_of(truth, truth, row_id, k)
        found, true = found + got, true + wanted
    return Recall(k, len(chosen), found, true, exact_only=True)


def _recall(args: argparse.Namespace) -> int:
    from embedline.errors import EmbedlineError

    try:
        measured = measure_recall(
            args.target,
            queries=args.queries,
            k=args.k,
            seed=args.seed,
            where=args.where,
            run=args.run,
        )
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    except FileNotFoundError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    print(measured.line())
    return 0
