"""Read a committed run back: exactly the chunk objects its manifest lists
(docs/reference/sinks.md, "Reading").

``pd.read_parquet("out/chunks")`` mixes every run that ever wrote to the output root (chunks
are content-addressed and shared); the manifest is the only list of one run's objects.
Every object read is checked against the manifest's SHA-256 and row count.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from adapters.object_store import open_store
from embedline.errors import ConflictError, InputError
from embedline.models import manifest_object_key
from embedline.protocols import ObjectStore
from tasks.commit.manifest import (
    extra_columns,
    latest_manifest,
    list_manifests,
    live_rows,
    read_manifest,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLUMNS",
    "chunk_table",
    "chunk_tables",
    "read_embeddings",
    "read_embeddings_arrow",
    "resolve_run",
]

#: The columns a reader gets, in this order (then the run's kept columns and ``text``).
COLUMNS = ("id", "embedding", "text_sha256")

_RUN_KEY_RE = re.compile(r"^[0-9a-f]{64}$")


def resolve_run(store: ObjectStore, run: str | None = None) -> dict[str, Any]:
    """Return the committed manifest of ``run`` (a run key, or a unique prefix of at least 8
    hex characters), or of the latest committed run (``latest_manifest``) when None.

    :raises InputError: no committed run matches, or the prefix is ambiguous.
    :raises ConflictError: the manifest object is not an embedline manifest.
    """
    if run is not None:
        wanted = run.strip().lower()
        if not _RUN_KEY_RE.match(wanted):
            if len(wanted) < 8 or any(c not in "0123456789abcdef" for c in wanted):
                raise InputError(f"run {run!r}: give a run key or at least 8 of its hex digits")
            matches = sorted(
                {
                    str(m["run_key"])
                    for m in list_manifests(store)
                    if str(m["run_key"]).startswith(wanted)
                }
            )
            if len(matches) != 1:
                raise InputError(
                    f"run {run!r}: {'ambiguous' if matches else 'no committed run'}"
                    f" under {store.uri}"
                )
            wanted = matches[0]
        manifest = read_manifest(store, wanted)
        if manifest is None:
            raise InputError(
                f"run {wanted} has no committed manifest under {store.uri} "
                f"({store.uri_for(manifest_object_key(wanted))} is missing)"
            )
        return manifest
    latest = latest_manifest(store)
    if latest is None:
        raise InputError(f"no committed run under {store.uri} (no manifests/*.json)")
    return latest


def chunk_table(store: ObjectStore, entry: dict[str, Any], extra: Sequence[str] = ()) -> pa.Table:
    """Read one chunk object as ``id``/``embedding``/``text_sha256`` and the ``extra``
    columns (the run's kept columns and ``text``: ``tasks.commit.manifest.extra_columns``),
    checked against its manifest entry (``object``, ``rows``, ``sha256``); the rows the
    entry drops (``drop_ids``) are left out (``tasks.commit.manifest.live_rows``).

    :raises ConflictError: the bytes or row count differ from the manifest.
    :raises FileNotFoundError: the object is missing.
    """
    body = store.get(str(entry["object"]))
    if hashlib.sha256(body).hexdigest() != entry["sha256"]:
        raise ConflictError(
            f"{store.uri_for(entry['object'])} does not match its manifest's "
            "SHA-256: the object was changed after publishing"
        )
    table = pq.read_table(io.BytesIO(body), columns=[*COLUMNS, *extra])
    table = live_rows(table, entry, uri=store.uri_for(str(entry["object"])))
    return table.replace_schema_metadata(None)


def chunk_tables(
    store: ObjectStore, manifest: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], pa.Table]]:
    """Yield ``(manifest chunk entry, Arrow table of id/embedding/text_sha256 and the run's
    kept columns and text)`` in chunk order, one object in memory at a time.

    :raises ConflictError: an object's bytes or row count differ from the manifest.
    :raises FileNotFoundError: an object the manifest lists is missing.
    """
    extra = extra_columns(manifest)
    for entry in manifest["chunks"]:
        yield entry, chunk_table(store, entry, extra)


def read_embeddings_arrow(output: str, run: str | None = None) -> pa.Table:
    """Return a run's vectors as a ``pyarrow.Table``: ``id`` (string), ``embedding``
    (fixed-size list of float32, the run's dimensions), ``text_sha256`` (string), then the
    run's kept columns under their CSV names and ``text`` if it kept the text (strings,
    exactly as read).

    ``output`` is the run's ``--output`` (a directory, ``file://`` or ``s3://`` URI); ``run``
    a run key or a unique prefix (≥ 8 hex), default the latest committed run. The table's
    chunks are the Parquet objects' own buffers: vectors are not copied. Rows in manifest
    order: input order within each object; a delta night's objects after those it inherits.
    The schema metadata carries the run key, model and dimensions.

    :raises InputError: no such committed run.
    :raises ConflictError: an object differs from what the manifest recorded.
    """
    store = open_store(output)
    manifest = resolve_run(store, run)
    # a 0-row chunk may carry a variable-size embedding list (docs/reference/output-layout.md):
    # nothing to add
    tables = [t for _, t in chunk_tables(store, manifest) if t.num_rows]
    dims = int(manifest["dimensions"])
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("embedding", pa.list_(pa.float32(), dims)),
            ("text_sha256", pa.string()),
        ]
        + [(c, pa.string()) for c in extra_columns(manifest)]
    )
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table.replace_schema_metadata(
        {
            "embedline.run_key": str(manifest["run_key"]),
            "embedline.model": str(manifest["model"]),
            "embedline.dimensions": str(dims),
        }
    )


def read_embeddings(output: str, run: str | None = None) -> pd.DataFrame:
    """Return a run's vectors as a pandas DataFrame: ``id`` and ``text_sha256`` (str),
    ``embedding`` (one float32 numpy array of the run's dimensions per row; the arrays are
    row views of one contiguous matrix), then the run's kept columns and ``text`` (str). Arguments
    and errors as ``read_embeddings_arrow``;
    ``df.attrs`` holds ``run_key``, ``model`` and ``dimensions``.
    """
    import numpy as np
    import pandas as pd

    table = read_embeddings_arrow(output, run)
    dims = int(table.schema.metadata[b"embedline.dimensions"])
    column = table.column("embedding").combine_chunks()
    flat = column.flatten().to_numpy(zero_copy_only=False) if len(column) else np.empty(0)
    matrix = np.ascontiguousarray(flat, dtype=np.float32).reshape(len(column), dims)
    frame = pd.DataFrame(
        {
            "id": table.column("id").to_pandas(),
            "embedding": pd.Series(list(matrix), dtype=object),
            "text_sha256": table.column("text_sha256").to_pandas(),
            **{name: table.column(name).to_pandas() for name in table.column_names[3:]},
        }
    )
    meta = table.schema.metadata
    frame.attrs.update(
        run_key=meta[b"embedline.run_key"].decode(),
        model=meta[b"embedline.model"].decode(),
        dimensions=dims,
    )
    return frame
