"""Stable names over versioned sink tables, switched in one step (docs/reference/sinks.md, model
cutover).

- PostgreSQL (``PgAlias``): the alias is a view ``CREATE VIEW alias AS SELECT * FROM table``
  carrying the table's embedline metadata as its comment; a switch drops and creates it in
  one transaction, under an advisory lock, with the registry table ``embedline_aliases``
  (alias, current, previous, switched_at) updated in the same transaction. PostgreSQL's DDL is
  transactional, and a query that waited for the view's lock looks the name up again once it
  has it (``RangeVarGetRelidExtended``): readers see the old table or the new one, never an
  error or a mix. The view is dropped and made again rather than ``CREATE OR REPLACE``d
  because a new model changes the embedding column's type (``vector(N)``), which ``REPLACE``
  refuses.
- Qdrant (``QdrantAlias``): a collection alias, switched by one ``update_collection_aliases``
  call holding the delete and the create (atomic on the server:
  https://qdrant.tech/documentation/concepts/collections/#collection-aliases); the previous
  collection is kept in the payload of one point per alias in the collection
  ``embedline_aliases`` (written after the switch: the alias itself is the truth for current).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from embedline.errors import InputError
from embedline.protocols import AliasState

__all__ = ["REGISTRY", "PgAlias", "QdrantAlias"]

REGISTRY = "embedline_aliases"
_LOCK_KEY = "embedline-aliases"


class PgAlias:
    """Alias (a view) ``alias`` in the PostgreSQL database at ``dsn`` (password-free)."""

    def __init__(self, dsn: str, alias: str) -> None:
        self.dsn = dsn
        self.alias = alias
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            import psycopg

            from adapters.sinks.pg_errors import translate

            try:
                # no prepared statements: PgBouncer in transaction mode (pgvector.py)
                self._conn = psycopg.connect(self.dsn, connect_timeout=10, prepare_threshold=None)
            except psycopg.Error as exc:
                raise translate(exc, f"PostgreSQL {self.dsn}") from None
        return self._conn

    def state(self) -> AliasState:
        """Where the view points, from the registry (no registry yet: nowhere)."""
        conn = self._connection()
        with conn.transaction():
            if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (REGISTRY,)).fetchone()[0]:
                return AliasState(self.alias, None, None)
            row = conn.execute(
                f"SELECT current, previous FROM {REGISTRY} WHERE alias = %s", (self.alias,)
            ).fetchone()
        return AliasState(self.alias, *(row or (None, None)))

    def switch(self, table: str) -> AliasState:
        """Point the view at ``table`` in one transaction (see the module docstring).

        :raises InputError: ``alias`` is a table or a view embedline did not make.
        """
        from psycopg import sql

        conn = self._connection()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_LOCK_KEY,))
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {REGISTRY} (alias text PRIMARY KEY, "
                "current text NOT NULL, previous text, "
                "switched_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute(
                f"SELECT current FROM {REGISTRY} WHERE alias = %s FOR UPDATE", (self.alias,)
            ).fetchone()
            current = None if row is None else row[0]
            self._refuse_foreign(conn, made_here=current is not None)
            if current == table:
                return self.state()
            view, target = sql.Identifier(self.alias), sql.Identifier(table)
            comment = conn.execute(
                "SELECT obj_description(to_regclass(%s), 'pg_class')", ('"' + table + '"',)
            ).fetchone()[0]
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view))
            conn.execute(sql.SQL("CREATE VIEW {} AS SELECT * FROM {}").format(view, target))
            conn.execute(sql.SQL("COMMENT ON VIEW {} IS {}").format(view, sql.Literal(comment)))
            conn.execute(
                f"INSERT INTO {REGISTRY} (alias, current) VALUES (%s, %s) "
                "ON CONFLICT (alias) DO UPDATE SET current = excluded.current, "
                f"previous = {REGISTRY}.current, switched_at = now()",
                (self.alias, table),
            )
        return AliasState(self.alias, table, current)

    def check_name(self) -> None:
        """Refuse, before anything is loaded, an alias name taken by a table or by a view
        embedline did not make.

        :raises InputError: naming it.
        """
        conn = self._connection()
        with conn.transaction():
            made = self.state().current is not None
            self._refuse_foreign(conn, made_here=made)

    def _refuse_foreign(self, conn: Any, *, made_here: bool) -> None:
        kind = conn.execute(
            "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", ('"' + self.alias + '"',)
        ).fetchone()
        if kind is not None and (kind[0] != "v" or not made_here):
            raise InputError(
                f"PostgreSQL {self.dsn}: {self.alias!r} exists and is not an "
                "alias embedline made; pick another --alias name"
            )

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class QdrantAlias:
    """Collection alias ``alias`` of the Qdrant ``sink`` (a ``QdrantSink``: its client, so a
    local-mode directory is opened once)."""

    def __init__(self, sink: Any, alias: str) -> None:
        self.sink = sink
        self.alias = alias
        self._lock = threading.Lock()

    def _point_id(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"embedline-alias:{self.alias}"))

    def state(self) -> AliasState:
        """Where the alias points (the server's aliases) and the previous collection (the
        registry's point)."""
        with self._lock, self.sink.client_for("read aliases of") as client:
            current = next(
                (
                    a.collection_name
                    for a in client.get_aliases().aliases
                    if a.alias_name == self.alias
                ),
                None,
            )
            previous = None
            if client.collection_exists(REGISTRY):
                found = client.retrieve(REGISTRY, [self._point_id()], with_payload=True)
                previous = found[0].payload.get("previous") if found else None
        return AliasState(self.alias, current, previous)

    def check_name(self) -> None:
        """Refuse an alias name a collection already has.

        :raises InputError: naming it.
        """
        if self.state().current is not None:
            return
        with self._lock, self.sink.client_for("read collections of") as client:
            taken = client.collection_exists(self.alias)
        if taken:
            raise InputError(
                f"{self.sink.identity}: a collection is named {self.alias!r}; "
                "pick another --alias name"
            )

    def switch(self, table: str) -> AliasState:
        """Move the alias to collection ``table`` in one aliases call; record the previous.

        :raises InputError: a collection is named ``alias``.
        """
        from qdrant_client import models

        before = self.state()
        if before.current == table:
            return before
        self.check_name()
        with self._lock, self.sink.client_for("switch alias of") as client:
            operations: list[Any] = []
            if before.current is not None:
                operations.append(
                    models.DeleteAliasOperation(
                        delete_alias=models.DeleteAlias(alias_name=self.alias)
                    )
                )
            operations.append(
                models.CreateAliasOperation(
                    create_alias=models.CreateAlias(collection_name=table, alias_name=self.alias)
                )
            )
            client.update_collection_aliases(change_aliases_operations=operations)
            if not client.collection_exists(REGISTRY):
                client.create_collection(
                    REGISTRY,
                    vectors_config=models.VectorParams(size=1, distance=models.Distance.DOT),
                )
            client.upsert(
                REGISTRY,
                [
                    models.PointStruct(
                        id=self._point_id(),
                        vector=[0.0],
                        payload={"alias": self.alias, "current": table, "previous": before.current},
                    )
                ],
            )
        return AliasState(self.alias, table, before.current)

    def close(self) -> None:
        """Close the sink's client."""
        self.sink.close()
