"""Filtered nearest-neighbour search on a pgvector table: the true top k among matching rows.

The trap: with an HNSW index, ``WHERE title = $2 ORDER BY embedding <=> $1 LIMIT 10`` is
served by the index, which hands back ``hnsw.ef_search`` (40) candidates, and only then is
the filter applied: a filter matching 1 % of the rows returns 0 or 1 rows instead of 10
(measured on pgvector 0.6.2: 1 row while 773 matched). pgvector 0.8 added iterative index
scans (``hnsw.iterative_scan``): the scan goes on through the graph until enough rows pass
the filter, up to ``hnsw.max_scan_tuples`` visited tuples.

What this module does (``filtered_search``), and why:

- No HNSW index on the table: the plain query; PostgreSQL scans and sorts, exactly.
- An index, and a selective filter (``EXACT_FRACTION`` of the rows or fewer by the planner's
  estimate), or pgvector older than 0.8: an exact scan. The rows are filtered in a
  ``MATERIALIZED`` CTE, which the planner cannot serve from the vector index, and only the
  matching rows are scored and sorted. For a selective filter this is also the cheaper plan:
  one pass over the table, distances for few rows; an iterative index scan would visit about
  ``ef_search / fraction`` graph nodes (and their neighbours) at random to find enough
  matches, and could still stop at ``max_scan_tuples`` short of k.
- An index and a broad filter on pgvector ≥ 0.8: the index with ``SET LOCAL
  hnsw.iterative_scan = strict_order`` (results in exact distance order, so no re-sort),
  ``hnsw.max_scan_tuples`` raised to the table's row count (the scan never stops short while
  k rows match) and ``hnsw.ef_search`` at least k, all ``SET LOCAL`` inside the search's own
  transaction. Here the filter passes often and the scan ends after a few hundred nodes; the
  hits are what HNSW finds, as for an unfiltered search through the index.

``exact=True`` (``embedline search --exact``, and the exact side of ``embedline recall``): the
exact scan whatever the filter, also with none. The ``MATERIALIZED`` CTE is what keeps the
index out; no ``SET`` of planner switches (``enable_indexscan``) is needed, so nothing of the
session changes and a pooler in transaction mode (PgBouncer) sees one plain statement.

The estimate comes from the planner's statistics (``EXPLAIN`` of the filter, no execution);
a table never analyzed gives PostgreSQL's default equality selectivity (0.5 %): exact.
Column names are ``psycopg.sql.Identifier``s and values parameters: nothing a user typed is
pasted into SQL. Rule source: https://github.com/pgvector/pgvector#iterative-index-scans
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["EXACT_FRACTION", "ITERATIVE_SCAN_VERSION", "filtered_search", "search_plan"]

#: Filters the planner expects to match at most this share of the rows are searched exactly.
EXACT_FRACTION = 0.02
#: The first pgvector with ``hnsw.iterative_scan``.
ITERATIVE_SCAN_VERSION = (0, 8, 0)
_MAX_EF_SEARCH = 1000  # pgvector's upper bound for hnsw.ef_search


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(text).split("."))
    except ValueError:
        return (0,)


def search_plan(conn: Any, table: Any, index: str, where: Sequence[tuple[str, str]]) -> str:
    """``"plain"``, ``"exact"`` or ``"iterative"``: how ``filtered_search`` searches ``table``
    (a ``psycopg.sql.Identifier``) for rows meeting ``where`` (see the module docstring);
    ``index``: the HNSW index's name, quoted as ``to_regclass`` takes it."""
    from psycopg import sql

    if not where:
        return "plain"
    if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (index,)).fetchone()[0]:
        return "plain"
    version = conn.execute(
        "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
    ).fetchone()
    if version is None or _version(version[0]) < ITERATIVE_SCAN_VERSION:
        return "exact"
    condition = _condition(where)
    explained = conn.execute(
        sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE {}").format(table, condition),
        [v for _, v in where],
    ).fetchone()[0]
    plan = (explained if isinstance(explained, list) else json.loads(explained))[0]["Plan"]
    matching = float(plan.get("Plan Rows", 0))
    total = conn.execute(
        "SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (table.as_string(conn),)
    ).fetchone()[0]
    if total is None or float(total) <= 0:  # never analyzed: no idea how selective
        return "exact"
    return "exact" if matching <= EXACT_FRACTION * float(total) else "iterative"


def _condition(where: Sequence[tuple[str, str]]) -> Any:
    from psycopg import sql

    return sql.SQL(" AND ").join(
        sql.SQL("{} = %s").format(sql.Identifier(name)) for name, _ in where
    )


def filtered_search(
    conn: Any,
    table: Any,
    index: str,
    vector: np.ndarray,
    k: int,
    columns: Sequence[str] = (),
    where: Sequence[tuple[str, str]] = (),
    *,
    exact: bool = False,
    half_dims: int | None = None,
) -> list[tuple[Any, ...]]:
    """Up to ``k`` ``(id, cosine distance, *values of columns)`` of ``table``, nearest first,
    among the rows whose ``where`` columns equal their values; in ``conn``'s current
    transaction (the ``SET LOCAL``s end with it). ``vector``: float32, the table's length.
    ``exact``: the exact scan, never the index (ties in distance ordered by id).
    ``half_dims``: the table's HNSW index is over ``embedding::halfvec(half_dims)``
    (2,001–4,000 dimensions): searches that may use it order by the distance cast the same
    way, as the index only serves that expression (distances then in half precision)."""
    from psycopg import sql

    plan = "exact" if exact else search_plan(conn, table, index, where)
    extra = sql.SQL("").join(sql.SQL(", {}").format(sql.Identifier(c)) for c in columns)
    values = [v for _, v in where]
    condition = _condition(where) if where else sql.SQL("TRUE")
    if plan == "exact":
        query = sql.SQL(
            "WITH matching AS MATERIALIZED (SELECT id, embedding{extra} FROM {table} "
            "WHERE {condition}) SELECT id, embedding <=> %s AS distance{extra} FROM matching "
            "ORDER BY distance, id LIMIT %s"
        ).format(extra=extra, table=table, condition=condition)
        return list(conn.execute(query, [*values, vector, k]).fetchall())
    if plan == "iterative":
        rows = conn.execute(
            sql.SQL("SELECT reltuples FROM pg_class WHERE oid = %s::regclass"),
            (table.as_string(conn),),
        ).fetchone()[0]
        settings = {
            "hnsw.iterative_scan": "strict_order",
            "hnsw.max_scan_tuples": str(max(20_000, int(float(rows) * 2))),
            "hnsw.ef_search": str(min(_MAX_EF_SEARCH, max(40, k))),
        }
        for name, value in settings.items():
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))
    distance = (
        sql.SQL("embedding::halfvec({d}) <=> %s::halfvec({d})").format(d=sql.Literal(half_dims))
        if half_dims
        else sql.SQL("embedding <=> %s")
    )
    query = sql.SQL(
        "SELECT id, {distance} AS distance{extra} FROM {table} WHERE {condition} "
        "ORDER BY distance LIMIT %s"
    ).format(distance=distance, extra=extra, table=table, condition=condition)
    return list(conn.execute(query, [vector, *values, k]).fetchall())
