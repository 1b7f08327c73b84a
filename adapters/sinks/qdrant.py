"""Qdrant sink: a Qdrant collection, on a server or in ``qdrant-client``'s local mode
(docs/reference/sinks.md).

Collection (created if absent): one unnamed vector of ``d`` float32 with ``Cosine``
distance; embedline's metadata (``embedline.sink.v1``: embedder, model, dimensions) is the
collection's ``metadata["embedline"]`` (Qdrant ≥ 1.16). Qdrant normalizes vectors to unit
length on upload for ``Cosine``, so a vector read back equals the run's divided by its norm
(the embedders' vectors are unit length already, to float32 rounding).

**Point ids.** Qdrant takes only unsigned integers and UUIDs as point ids, so the point id of
CSV id ``X`` is ``uuid5(POINT_NAMESPACE, X)`` (RFC 9562 §5.5: name-based, SHA-1; any string,
NUL bytes included, maps to one UUID), and the payload keeps the CSV id itself: a point's
payload is ``{"id": X, "text_sha256": …, "run_key": …}``, and in a collection with kept
columns also ``kept_sha256`` and each kept column (and ``text``) under its CSV name
(``point_payloads`` is the one place a payload is built). What the sink holds is read from
the payloads (``held_keys``), never from a ledger. On a server, ``id`` and the kept columns
get keyword payload indexes when the collection is created, so Qdrant's planner can serve a
filtered search (``search(where=…)``) from them.

**Modes.** ``QdrantSink(url=…)`` talks to a server over HTTP (REST, port 6333 by default); the
API key comes from ``QDRANT_API_KEY`` only, never from the URI, and is never logged.
``QdrantSink(path=…)`` is the embedded local mode (no server): the collection lives in a
directory, and one process at a time may open it (``qdrant-client`` locks the directory;
another process gets ``RetryableError``: rerun once it has finished). Local mode keeps every
point in memory and searches exactly; ``qdrant-client`` warns above 20,000 points, which the
sink silences (it would repeat on every load) and says once per load in its own words.

Qdrant has no transactions: a chunk's upsert is one request (or a few, for very long
vectors), each applied whole (``wait=True``: visible when it returns). A load killed midway
leaves some of a chunk's points; the next load reads what the collection holds and upserts
only the rest. Rule source: https://qdrant.tech/documentation/concepts/points/ (ids, upsert,
scroll, delete by filter), https://qdrant.tech/documentation/concepts/collections/.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.sinks.base import (
    KeptColumnsCache,
    check_compatible,
    exact_top_k,
    extra_values,
    held_key_columns,
    sink_metadata,
    sink_table_from_metadata,
    vector_matrix,
)
from embedline.errors import FatalError, RetryableError
from embedline.progress import PROGRESS_LOGGER
from embedline.protocols import SinkColumns, SinkTable, UpsertResult

__all__ = [
    "API_KEY_ENV",
    "LOCAL_MODE_ADVISED_POINTS",
    "POINT_NAMESPACE",
    "QdrantSink",
    "point_id",
    "point_payloads",
]

logger = logging.getLogger("embedline")
progress_logger = logging.getLogger(PROGRESS_LOGGER)  # shown at INFO (embedline.progress)

#: The namespace of the point ids (``uuid5(uuid.NAMESPACE_URL, "embedline:qdrant:point-id")``);
#: fixed for good: changing it would orphan every point of every collection.
POINT_NAMESPACE = uuid.UUID("20d4e413-4837-5f26-8dc8-af8cef2ed8e0")
API_KEY_ENV = "QDRANT_API_KEY"
#: Points above which ``qdrant-client`` advises a server over local mode (its own threshold).
LOCAL_MODE_ADVISED_POINTS = 20_000
_META_KEY = "embedline"
_PAGE = 10_000  # points per scroll page / retrieve batch
_FLOATS_PER_REQUEST = 1_000_000  # about 10-20 MB of JSON, under the server's 32 MB default
_RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")  # a payload key Qdrant reads as itself, not a path


def point_id(row_id: str) -> str:
    """The Qdrant point id (a UUID string) of CSV id ``row_id``:
    ``uuid5(POINT_NAMESPACE, row_id)``."""
    return str(uuid.uuid5(POINT_NAMESPACE, row_id))


def point_payloads(
    rows: pa.Table, *, run_key: str, columns: SinkColumns = SinkColumns()
) -> list[dict[str, Any]]:
    """The payload of each row of an upsert batch: ``id``, ``text_sha256``, ``run_key``, and
    with kept ``columns`` ``kept_sha256`` and each of ``columns.names`` (strings, as in the
    CSV). The one place a point's payload is built.

    :raises FatalError: the batch lacks a column the collection keeps (``extra_values``).
    """
    values: dict[str, list[Any]] = {
        name: rows.column(name).to_pylist() for name in ("id", "text_sha256")
    }
    values.update(extra_values(rows, columns))
    return [
        {**{name: column[i] for name, column in values.items()}, "run_key": run_key}
        for i in range(rows.num_rows)
    ]


def _quiet_local_mode_warning() -> None:
    """Silence ``qdrant-client``'s "Local mode is not recommended for collections with more
    than 20,000 points" (it comes at every open and upsert); ``finalize`` says it once."""
    warnings.filterwarnings("ignore", message="Local mode is not recommended", category=UserWarning)


class QdrantSink(KeptColumnsCache):
    """Collection ``collection`` of a Qdrant server at ``url`` (``http://HOST:PORT`` or
    ``https://…``) or of the local-mode directory ``path`` (exactly one of the two).

    Server: two chunk loads at once (``parallel_loads``; the client is thread-safe). Local
    mode: one (a single in-process collection)."""

    def __init__(
        self,
        *,
        collection: str,
        url: str | None = None,
        path: str | None = None,
        identity: str | None = None,
    ) -> None:
        if (url is None) == (path is None):
            raise ValueError("give exactly one of url and path")
        self.collection = collection
        self.table_name = collection
        self.url = url
        self.path = path
        self.local = path is not None
        self.parallel_loads = 1 if self.local else 2
        self.identity = identity or (
            f"qdrant+local://{path}?collection={collection}"
            if self.local
            else f"{url}/{collection}"
        )
        self._client_: Any = None
        self._lock = threading.RLock()
        self._kept: SinkColumns | None = None  # the collection's columns, once read

    def __repr__(self) -> str:
        return f"QdrantSink({self.identity!r})"

    def _client(self) -> Any:
        with self._lock:
            if self._client_ is None:
                from qdrant_client import QdrantClient

                with self._errors("open"):
                    if self.local:
                        assert self.path is not None
                        _quiet_local_mode_warning()
                        os.makedirs(self.path, exist_ok=True)
                        # tasks run in worker threads; calls are serialized by self._lock
                        self._client_ = QdrantClient(
                            path=self.path, force_disable_check_same_thread=True
                        )
                    else:
                        key = os.environ.get(API_KEY_ENV) or None
                        if key and self.url and self.url.startswith("http://"):
                            # qdrant-client warns at every client; said once per sink here
                            warnings.filterwarnings(
                                "ignore",
                                category=UserWarning,
                                message="Api key is used with an insecure",
                            )
                            logger.warning(
                                "%s: %s is sent over plain HTTP; use qdrant+https:// "
                                "unless the network is trusted",
                                self.identity,
                                API_KEY_ENV,
                            )
                        self._client_ = QdrantClient(
                            url=self.url,
                            api_key=key,
                            timeout=60,
                            prefer_grpc=False,
                            check_compatibility=False,
                        )
            return self._client_

    @contextmanager
    def client_for(self, what: str) -> Iterator[Any]:
        """The sink's ``qdrant-client`` (one per sink, so a local-mode directory is opened
        once) for an operation ``what`` of a caller beside the sink (``QdrantAlias``), with
        its errors turned into embedline's as in the sink's own calls."""
        with self._errors(what):
            yield self._client()

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """``qdrant-client``'s errors as embedline's, at one point: an unreachable server,
        429 and 5xx are retryable; 401/403 name ``QDRANT_API_KEY``; another process holding a
        local directory is retryable; other refusals are fatal. Messages never carry the key
        or a payload (an upsert's refusal names only the HTTP status)."""
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        where = f"{what} {self.identity}"
        try:
            yield
        except UnexpectedResponse as exc:
            status = exc.status_code
            detail = (exc.content or b"").decode("utf-8", "replace").replace("\n", " ")[:200]
            if status in (401, 403):
                raise FatalError(
                    f"{where}: the server refused the credentials (HTTP {status});"
                    f" set {API_KEY_ENV} to the collection's API key"
                ) from None
            if status in _RETRYABLE_STATUS:
                raise RetryableError(
                    f"{where}: HTTP {status} from Qdrant; rerun the same command to load the rest"
                ) from None
            if what == "upsert into":  # a refusal of a body may quote its payload values
                detail = exc.reason_phrase
            raise FatalError(f"{where}: Qdrant refused it (HTTP {status}: {detail})") from None
        except ResponseHandlingException as exc:  # connection refused, timeouts, TLS
            raise RetryableError(
                f"{where}: Qdrant is unreachable ({type(exc.source).__name__})"
                "; check the URI, then rerun the same command"
            ) from None
        except RuntimeError as exc:
            if "already accessed by another instance" not in str(exc):
                raise
            raise RetryableError(
                f"{where}: another process has this local Qdrant directory "
                "open (local mode allows one at a time); rerun once it has "
                "finished, or use a Qdrant server"
            ) from None

    def describe(self) -> SinkTable | None:
        """Return the collection's metadata and point count, or None if it does not exist."""
        with self._lock, self._errors("describe"):
            client = self._client()
            if not client.collection_exists(self.collection):
                return None
            info = client.get_collection(self.collection)
            rows = int(client.count(self.collection, exact=True).count)
        from qdrant_client import models

        vectors = info.config.params.vectors  # a dict when the vectors are named
        dims = int(vectors.size) if isinstance(vectors, models.VectorParams) else 0
        meta = (info.config.metadata or {}).get(_META_KEY)
        return sink_table_from_metadata(
            meta if isinstance(meta, str) else None, dimensions=dims, rows=rows
        )

    def ensure_table(
        self, *, embedder: str, model: str, dimensions: int, columns: SinkColumns = SinkColumns()
    ) -> SinkTable:
        """Create the collection if absent (Cosine, ``dimensions`` long, embedline's metadata
        naming the kept ``columns``); check an existing one.

        :raises FatalError: another length, model, kept columns or vector layout (exit 3).
        """
        from qdrant_client import models
        from qdrant_client.http.exceptions import UnexpectedResponse

        with self._lock, self._errors("create"):
            client = self._client()
            if not client.collection_exists(self.collection):
                meta = sink_metadata(
                    embedder=embedder, model=model, dimensions=dimensions, columns=columns
                )
                try:
                    client.create_collection(
                        self.collection,
                        metadata={_META_KEY: meta},
                        vectors_config=models.VectorParams(
                            size=dimensions, distance=models.Distance.COSINE
                        ),
                    )
                except UnexpectedResponse as exc:  # created meanwhile by another loader
                    if exc.status_code != 409:
                        raise
                if not self.local:  # delete_other_runs filters on run_key, search on the rest
                    for field in ("run_key", "id", *columns.kept):
                        client.create_payload_index(
                            self.collection, field, field_schema=models.PayloadSchemaType.KEYWORD
                        )
            self._check_shape(client, dimensions)
        found = self.describe()
        assert found is not None
        check_compatible(
            found,
            where=f"Qdrant collection {self.identity}",
            model=model,
            dimensions=dimensions,
            columns=columns,
            called="collection",
        )
        self._kept = found.columns
        return found

    def _check_shape(self, client: Any, dimensions: int) -> None:
        """Refuse a collection of another vector layout before any point is sent.

        :raises FatalError: naming each difference (exit 3).
        """
        from qdrant_client import models

        vectors = client.get_collection(self.collection).config.params.vectors
        problems = []
        if not isinstance(vectors, models.VectorParams):
            problems.append("its vectors are named (embedline writes one unnamed vector)")
        else:
            if vectors.distance != models.Distance.COSINE:
                problems.append(f"distance {vectors.distance.value}, not Cosine")
            if vectors.multivector_config is not None:
                problems.append("multivectors")
            if vectors.datatype not in (None, models.Datatype.FLOAT32):
                problems.append(f"datatype {vectors.datatype.value}, not float32")
        if problems:
            raise FatalError(
                f"Qdrant collection {self.identity} is not of embedline's shape "
                f"(one unnamed {dimensions}-dimension Cosine vector): "
                + "; ".join(problems)
                + ". Load into another collection or "
                "drop that one"
            )

    def upsert(self, rows: pa.Table, *, run_key: str) -> UpsertResult:
        """Insert or replace ``rows`` by id (point id ``point_id(id)``), tagged ``run_key``.

        A vector holding NaN or infinity (Qdrant refuses it: "Vector contains NaN values") is
        left out, listed, and any point already under its id deleted. The rest goes in one
        request (rows of very long vectors in several, ≤ 1M floats each).

        :raises FatalError: the collection refused the write (credentials, its shape).
        :raises RetryableError: the server was unreachable or busy.
        """
        from qdrant_client import models

        if rows.num_rows == 0:
            return UpsertResult(0)
        matrix = vector_matrix(rows)
        finite = np.isfinite(matrix).all(axis=1)
        ids = rows.column("id").to_pylist()
        refused = tuple(
            (
                int(i),
                ids[i],
                "non_finite_vector",
                None,
                "the vector holds NaN or infinity, which Qdrant refuses",
            )
            for i in np.flatnonzero(~finite)
        )
        good = np.flatnonzero(finite)
        payloads = point_payloads(
            rows.take(pa.array(good)), run_key=run_key, columns=self._columns()
        )
        step = max(1, _FLOATS_PER_REQUEST // max(1, matrix.shape[1]))
        with self._lock if self.local else _no_lock(), self._errors("upsert into"):
            client = self._client()
            for start in range(0, len(good), step):
                part = good[start : start + step]
                client.upsert(
                    self.collection,
                    wait=True,
                    points=models.Batch(
                        ids=[point_id(ids[i]) for i in part],
                        vectors=matrix[part].tolist(),
                        payloads=payloads[start : start + step],
                    ),
                )
        if refused:
            self.delete_ids([r[1] for r in refused])
        return UpsertResult(len(good), refused)

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete the points of CSV ids ``ids``; return how many existed."""
        from qdrant_client import models

        existed = 0
        with self._lock, self._errors("delete from"):
            client = self._client()
            for start in range(0, len(ids), _PAGE):
                points = [point_id(i) for i in ids[start : start + _PAGE]]
                found = client.retrieve(
                    self.collection, points, with_payload=False, with_vectors=False
                )
                if found:
                    existed += len(found)
                    client.delete(
                        self.collection,
                        wait=True,
                        points_selector=models.PointIdsList(points=[p.id for p in found]),
                    )
        return existed

    def delete_other_runs(self, run_key: str) -> int:
        """Delete every point whose payload ``run_key`` is not ``run_key``; return how many."""
        from qdrant_client import models

        others = models.Filter(
            must_not=[models.FieldCondition(key="run_key", match=models.MatchValue(value=run_key))]
        )
        with self._lock, self._errors("delete from"):
            client = self._client()
            count = int(client.count(self.collection, count_filter=others, exact=True).count)
            if count:
                client.delete(
                    self.collection, wait=True, points_selector=models.FilterSelector(filter=others)
                )
        return count

    def held_keys(self) -> pa.Table:
        """Every point's payload ``id`` and ``text_sha256`` (and ``kept_sha256`` with kept
        columns; strings), scrolled page by page (never the vectors or kept values): what the
        collection holds, the record loads decide by (docs/reference/sinks.md). Qdrant has no
        snapshot across pages: a load re-reads it after its writes and applies what another writer
        changed meanwhile."""
        key = held_key_columns(self._columns())
        values: dict[str, list[str | None]] = {name: [] for name in key}
        with self._lock, self._errors("read"):
            client = self._client()
            offset = None
            while True:
                points, offset = client.scroll(
                    self.collection,
                    limit=_PAGE,
                    offset=offset,
                    with_payload=key,
                    with_vectors=False,
                )
                for p in points:
                    payload = p.payload or {}
                    for name in key:
                        value = payload.get(name)
                        values[name].append(None if value is None else str(value))
                if offset is None:
                    break
        return pa.table({name: pa.array(values[name], type=pa.string()) for name in key})

    def needs_index(self) -> bool:
        """Never: this store builds no index a load must wait for (``finalize``)."""
        return False

    def finalize(self, *, keep_versions_s: float | None = None) -> str:
        """Nothing to build: a Qdrant server indexes (HNSW) in the background as points
        arrive; local mode searches exactly. In local mode above 20,000 points, one line
        says a server would serve better. ``keep_versions_s`` is LanceDB's."""
        if not self.local:
            return "nothing to build (the server indexes as points arrive)"
        found = self.describe()
        if found is not None and found.rows > LOCAL_MODE_ADVISED_POINTS:
            progress_logger.info(
                "%s: %d points in Qdrant's local mode, which qdrant-client advises "
                "for up to %d (it keeps them in memory and searches exactly); a "
                "Qdrant server loads and searches faster",
                self.identity,
                found.rows,
                LOCAL_MODE_ADVISED_POINTS,
            )
        return "nothing to build (local mode searches exactly)"

    def search(
        self,
        vector: np.ndarray,
        k: int,
        *,
        columns: Sequence[str] = (),
        where: Sequence[tuple[str, str]] = (),
        exact: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Cosine search: up to ``k`` ``(id, cosine similarity, *payload values of
        columns)``, most similar first, among the points whose ``where`` payload fields
        equal their values. ``exact``: the server scores every (matching) point instead of
        walking its HNSW graph (``SearchParams(exact=True)``).

        The filter is a payload ``Filter`` of ``FieldCondition``/``MatchValue``s (values as
        data, no filter text). Local mode searches exactly. A server plans a filtered search
        itself from its payload indexes (``ensure_table`` creates them for ``id`` and the kept
        columns: small cardinalities are scored exactly from the index, large ones through
        filterable HNSW); a filter on a field without a payload index is searched exactly
        (``exact=True``), since HNSW cannot account for it. A field name other than letters,
        digits, ``_`` and ``-`` is a payload path to Qdrant (``.`` nests, ``[]`` indexes;
        ``qdrant-client``'s local parser refuses a backtick or a space): such a filter scans
        the points and filters them here (exact)."""
        from qdrant_client import models

        query = np.asarray(vector, dtype=np.float32)
        if not all(_PLAIN_KEY.fullmatch(name) for name, _ in where):
            return self._scanned(query, k, columns, where)
        condition = (
            models.Filter(
                must=[
                    models.FieldCondition(key=name, match=models.MatchValue(value=value))
                    for name, value in where
                ]
            )
            if where
            else None
        )
        with self._lock, self._errors("search"):
            client = self._client()
            params = models.SearchParams(exact=True) if exact else None
            if where and not self.local and not exact:
                indexed = set(client.get_collection(self.collection).payload_schema or {})
                if any(name not in indexed for name, _ in where):
                    params = models.SearchParams(exact=True)
            # the whole payload with columns: a kept column's name may hold a "." that a
            # payload selector would read as a nested path
            hits = client.query_points(
                self.collection,
                query=query.tolist(),
                limit=k,
                query_filter=condition,
                search_params=params,
                with_payload=True if columns else ["id"],
            ).points
        return [
            (
                str((h.payload or {}).get("id")),
                float(h.score),
                *((h.payload or {}).get(c) for c in columns),
            )
            for h in hits
        ]

    def _scanned(
        self, vector: np.ndarray, k: int, columns: Sequence[str], where: Sequence[tuple[str, str]]
    ) -> list[tuple[Any, ...]]:
        """``search`` by scrolling every point (payload and vector) and filtering here."""
        ids: list[str] = []
        vectors: list[list[float]] = []
        values: list[list[Any]] = [[] for _ in columns]
        with self._lock, self._errors("search"):
            client = self._client()
            offset = None
            while True:
                points, offset = client.scroll(
                    self.collection,
                    limit=_PAGE,
                    offset=offset,
                    with_payload=True,
                    with_vectors=True,
                )
                for p in points:
                    payload = p.payload or {}
                    if all(payload.get(name) == value for name, value in where):
                        ids.append(str(payload.get("id")))
                        vectors.append(p.vector)
                        for column, name in zip(values, columns, strict=True):
                            column.append(payload.get(name))
                if offset is None:
                    break
        matrix = np.asarray(vectors, dtype=np.float32).reshape(len(ids), len(vector))
        return exact_top_k(matrix, ids, vector, k, values)

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors (float32) of CSV ids ``ids`` that the collection holds, by id
        (``retrieve`` by point id, ``_PAGE`` at a time)."""
        found: dict[str, np.ndarray] = {}
        with self._lock, self._errors("read from"):
            client = self._client()
            for start in range(0, len(ids), _PAGE):
                points = client.retrieve(
                    self.collection,
                    [point_id(i) for i in ids[start : start + _PAGE]],
                    with_payload=["id"],
                    with_vectors=True,
                )
                for p in points:
                    found[str((p.payload or {}).get("id"))] = np.asarray(p.vector, np.float32)
        return found

    def close(self) -> None:
        """Close the client (in local mode: release the directory for other processes)."""
        with self._lock:
            client, self._client_ = self._client_, None
            self._kept = None
        if client is not None:
            client.close()


@contextmanager
def _no_lock() -> Iterator[None]:
    yield
