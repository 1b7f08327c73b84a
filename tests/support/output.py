"""Read a run's published output back, as an outside check would: manifest, then chunks."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

__all__ = ["read_local_output", "read_manifest_file", "vectors_by_id"]


def read_manifest_file(root: Path) -> dict[str, Any]:
    """Return the only manifest under ``root/manifests`` (asserts there is exactly one)."""
    manifests = sorted((root / "manifests").glob("*.json"))
    assert len(manifests) == 1, manifests
    return json.loads(manifests[0].read_text())


def vectors_by_id(bodies: dict[str, bytes], manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """Check every manifest entry against its object and return ``{id: vector}``.

    Reads as a plain reader does (docs/reference/output-layout.md): each entry's object,
    without the ids it drops. Asserts: object SHA-256 and row counts match the manifest, no
    id appears twice, vectors are float32 of the manifest's dimensions.
    """
    vectors: dict[str, np.ndarray] = {}
    for entry in manifest["chunks"]:
        body = bodies[entry["object"]]
        assert hashlib.sha256(body).hexdigest() == entry["sha256"]
        table = pq.read_table(io.BytesIO(body))
        drops = set(entry.get("drop_ids") or ())  # a delta night's inherited object
        assert table.num_rows == entry["rows"] + len(drops)
        if entry["rows"]:  # a 0-row chunk of unknown length has a variable-size list
            assert table.schema.field("embedding").type.list_size == manifest["dimensions"]
        assert str(table.schema.field("embedding").type.value_type) == "float"
        ids = table.column("id").to_pylist()
        assert drops <= set(ids), "a dropped id is not in its object"
        for row_id, vector in zip(ids, table.column("embedding").to_pylist(), strict=True):
            if row_id in drops:
                continue
            assert row_id not in vectors, f"id {row_id!r} published twice"
            vectors[row_id] = np.asarray(vector, dtype=np.float32)
    return vectors


def read_local_output(root: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return ``(manifest, {id: vector})`` of a local output directory."""
    manifest = read_manifest_file(root)
    bodies = {e["object"]: (root / e["object"]).read_bytes() for e in manifest["chunks"]}
    return manifest, vectors_by_id(bodies, manifest)
