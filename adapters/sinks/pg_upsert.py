"""The pgvector sink's write path (docs/reference/sinks.md, "How pgvector writes"): one
upsert is one transaction — a binary ``COPY`` of the batch into a temporary stage table
(``ON COMMIT DROP``), then one ``INSERT … SELECT … ON CONFLICT (id) DO UPDATE`` from it; a row
the server refuses is isolated by bisecting the staged rows in savepoints. Nothing outlives
the transaction (PgBouncer in transaction mode). ``adapters.sinks.pgvector`` opens the
transaction; this module writes inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from adapters.sinks.pg_errors import classify, one_line, row_reason

__all__ = ["Batch", "Refusal", "refused_before_sending", "sql_stage", "upsert_staged"]

#: A refused row: (position in the batch, id, reason, SQLSTATE or None, message).
Refusal = tuple[int, str, str, str | None, str]


@dataclass(frozen=True, slots=True)
class Batch:
    """One upsert's rows by position: ``ids``, ``matrix`` (n × d float32), ``shas`` (text
    SHA-256 hex), ``extra`` (values of the kept columns, ``kept_sha256``, ``text``)."""

    ids: list[str]
    matrix: np.ndarray
    shas: list[str]
    extra: dict[str, list[Any]]


def sql_stage(dims: int, extra: Sequence[str] = ()) -> Any:
    """The per-transaction stage table a batch is COPYed into: ``n`` (the row's 0-based
    position in the batch), then the row's columns (``extra``: text columns)."""
    from psycopg import sql

    columns = sql.SQL("").join(sql.SQL(", {} text").format(sql.Identifier(n)) for n in extra)
    return sql.SQL(
        "CREATE TEMP TABLE embedline_stage (n integer, id text, embedding vector({}), "
        "text_sha256 text{}) ON COMMIT DROP"
    ).format(sql.Literal(dims), columns)


def refused_before_sending(
    ids: list[str], matrix: np.ndarray, extra: dict[str, list[Any]] | None = None
) -> list[Refusal]:
    """Rows no PostgreSQL table can take, found without a round trip: a NUL in the id or a
    kept value (text cannot hold U+0000: PostgreSQL manual, "Character Types"; psycopg
    refuses it client-side, with no SQLSTATE), NaN or infinity in the vector (pgvector
    refuses them). Messages name the column, never the value."""
    finite = np.isfinite(matrix).all(axis=1)
    refused: list[Refusal] = []
    for i, row_id in enumerate(ids):
        nul = next(
            (
                name
                for name, values in (extra or {}).items()
                if values[i] is not None and "\x00" in values[i]
            ),
            None,
        )
        if "\x00" in row_id:
            refused.append(
                (
                    i,
                    row_id,
                    "id_has_nul",
                    None,
                    "the id holds a NUL byte, which PostgreSQL text cannot store",
                )
            )
        elif nul is not None:
            refused.append(
                (
                    i,
                    row_id,
                    "value_has_nul",
                    None,
                    f"column {nul!r} holds a NUL byte, which PostgreSQL text cannot store",
                )
            )
        elif not finite[i]:
            refused.append(
                (
                    i,
                    row_id,
                    "non_finite_vector",
                    None,
                    "the vector holds NaN or infinity, which pgvector refuses",
                )
            )
    return refused


def upsert_staged(
    conn: Any, table: Any, batch: Batch, dims: int, run_key: str, refused: list[Refusal]
) -> int:
    """Upsert ``batch`` into ``table`` (a ``psycopg.sql.Identifier``) inside the open
    transaction of ``conn``: rows ``refused`` lists already (checked before sending) are
    skipped; rows the server refuses for good are appended to it, and any row already under
    a refused id is deleted. Returns the attempts (statements tried, at least 1).

    :raises psycopg.Error: a refusal that is not a row's (``classify``).
    """
    import psycopg

    skipped = {r[0] for r in refused}
    names = list(batch.extra)
    stack = [[i for i in range(len(batch.ids)) if i not in skipped]]
    attempts = 0
    conn.execute(sql_stage(dims, names))
    staged = _stage_all(conn, stack[0], batch)
    while stack:
        part = stack.pop()
        if not part:
            continue
        attempts += 1
        try:
            with conn.transaction():  # a savepoint: a refusal undoes only this part
                if not staged:
                    _stage(conn, part, batch)
                _insert(conn, table, part[0], part[-1], run_key, names)
        except psycopg.Error as exc:
            if classify(exc) != "row":
                raise
            if len(part) == 1:
                i = part[0]
                refused.append((i, batch.ids[i], row_reason(exc), exc.sqlstate, one_line(exc)))
            else:
                middle = len(part) // 2
                stack += [part[middle:], part[:middle]]
    _forget(conn, table, [r[1] for r in refused if r[2] != "id_has_nul"])
    return max(attempts, 1)


def _stage_all(conn: Any, part: list[int], batch: Batch) -> bool:
    """COPY rows ``part`` of ``batch`` into the stage table in a savepoint; False if the
    server refused a row on the way in (then each attempt stages its own rows)."""
    import psycopg

    if not part:
        return True
    try:
        with conn.transaction():
            _stage(conn, part, batch)
    except psycopg.Error as exc:
        if classify(exc) != "row":
            raise
        return False
    return True


def _stage(conn: Any, part: list[int], batch: Batch) -> None:
    """One binary COPY of rows ``part`` of ``batch`` (positions, ascending) into the
    stage table, each row under its position ``n``."""
    names = list(batch.extra)
    with conn.cursor().copy("COPY embedline_stage FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int4", "text", "vector", "text"] + ["text"] * len(names))
        for i in part:
            copy.write_row(
                (
                    i,
                    batch.ids[i],
                    batch.matrix[i],
                    batch.shas[i],
                    *(batch.extra[n][i] for n in names),
                )
            )


def _insert(conn: Any, table: Any, first: int, last: int, run_key: str, names: list[str]) -> None:
    """Upsert the staged rows at positions ``first``..``last`` (inclusive) into the table
    in one statement; ``names``: the kept columns (and ``kept_sha256``, ``text``)."""
    from psycopg import sql

    idents = [sql.Identifier(n) for n in names]
    columns = sql.SQL("").join(sql.SQL(", {}").format(i) for i in idents)
    updates = sql.SQL("").join(sql.SQL(", {} = EXCLUDED.{}").format(i, i) for i in idents)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, embedding, text_sha256, run_key{}) "
            "SELECT id, embedding, text_sha256, %s{} FROM embedline_stage "
            "WHERE n BETWEEN %s AND %s "
            "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, "
            "text_sha256 = EXCLUDED.text_sha256, run_key = EXCLUDED.run_key{}"
        ).format(table, columns, columns, updates),
        (run_key, first, last),
    )


def _forget(conn: Any, table: Any, ids: list[str]) -> None:
    """Delete rows under refused ids: one statement, or one per id if the server refuses
    an id (one it cannot even compare cannot be in the table: skipped)."""
    import psycopg
    from psycopg import sql

    if not ids:
        return
    delete = sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(table)
    try:
        with conn.transaction():
            conn.execute(delete, (ids,))
        return
    except psycopg.Error as exc:
        if classify(exc) != "row":
            raise
    for row_id in ids:
        try:
            with conn.transaction():
                conn.execute(delete, ([row_id],))
        except psycopg.Error as exc:
            if classify(exc) != "row":
                raise
