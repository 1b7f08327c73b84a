"""Read a Qdrant local-mode collection the way a user would (``qdrant-client``, no embedline)."""

from __future__ import annotations

import numpy as np

__all__ = ["delete_points", "qdrant_path", "qdrant_vectors", "unit_vectors"]


def qdrant_path(sink: str) -> str:
    """The directory of a ``qdrant+local://PATH?collection=NAME`` URI."""
    return sink[len("qdrant+local://") :].rpartition("?")[0]


def qdrant_vectors(path: str, collection: str) -> list[tuple[str, np.ndarray]]:
    """Every point's CSV id (payload ``id``) and vector (float32), in scroll order."""
    from qdrant_client import QdrantClient

    client = QdrantClient(path=path)
    try:
        points, _ = client.scroll(collection, limit=10**7, with_payload=["id"], with_vectors=True)
    finally:
        client.close()
    return [(str(p.payload["id"]), np.asarray(p.vector, dtype=np.float32)) for p in points]


def delete_points(path: str, collection: str, ids: list[str]) -> None:
    """Someone else deletes the points of CSV ids ``ids`` (by payload, as a user would)."""
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=path)
    try:
        client.delete(
            collection,
            points_selector=models.FilterSelector(
                filter=models.Filter(
                    must=[models.FieldCondition(key="id", match=models.MatchAny(any=ids))]
                )
            ),
        )
    finally:
        client.close()


def unit_vectors(vectors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``vectors`` divided by their norms: what Qdrant stores for a Cosine collection."""
    return {k: (v / np.linalg.norm(v)).astype(np.float32) for k, v in vectors.items()}
