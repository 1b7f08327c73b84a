"""``embedline search TARGET "query" [--k 10]``: the nearest ids to a query, by cosine similarity.

TARGET is a run's output root (searches the latest committed run's published vectors, or
``--run``) or a sink URI (LanceDB, pgvector or Qdrant). The query is embedded with the embedder and
model that made the vectors: the run's manifest says which, or the sink table's metadata.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from cli.common import DEFAULT_LEDGER, EXIT_USAGE, HELP_FORMATTER, fail, positive_int

__all__ = ["add_parsers", "search_target", "top_k"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``search``."""
    search = sub.add_parser("search", help="ids nearest to a query (cosine similarity)",
                            formatter_class=HELP_FORMATTER)  # fmt: skip
    search.add_argument("target", metavar="TARGET",
                        help="an output root (directory or s3://), or a sink URI "
                             "(lancedb://PATH, PATH/NAME.lance, postgresql://…, "
                             "qdrant://HOST:PORT/COLLECTION, qdrant+local://PATH)")
    search.add_argument("query", metavar="QUERY", type=_query,
                        help="the text to search for (not blank)")
    search.add_argument("--k", type=positive_int, default=10, help="results to print")
    search.add_argument("--run", default=None,
                        help="with an output root: a run key or prefix (default: the latest)")
    search.add_argument("--base-url", default=None,
                        help="for openai vectors: the API root (default: the run's recorded "
                             "--base-url in --ledger, else OpenAI's if a key is set)")
    search.add_argument("--ledger", default=DEFAULT_LEDGER,
                        help="the ledger `run` wrote (relative to the current directory): "
                             "which --base-url embedded the run's vectors")
    search.set_defaults(handler=_search, resumable=False)


def _query(text: str) -> str:
    """argparse type: a query with some non-blank text (a blank one is never sent: the
    API refuses it, and an embedding of nothing ranks nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is blank: give the text to search for")
    return text


def top_k(matrix: Any, ids: list[str], vector: Any, k: int) -> list[tuple[str, float]]:
    """The ``k`` rows of ``matrix`` (float32, rows × d) most cosine-similar to ``vector``
    (d,), as ``(id, similarity)``, most similar first."""
    import numpy as np

    if not len(ids):
        return []
    norms = np.linalg.norm(matrix, axis=1) * max(float(np.linalg.norm(vector)), 1e-12)
    scores = (matrix @ vector) / np.where(norms == 0, 1, norms)
    k = min(k, len(ids))
    best = np.argpartition(-scores, k - 1)[:k]
    best = best[np.argsort(-scores[best], kind="stable")]
    return [(ids[i], float(scores[i])) for i in best]


def _is_sink(target: str) -> bool:
    from adapters.sinks import is_sink_uri

    return is_sink_uri(target)


def _recorded_base_url(ledger_path: str, *, run_key: str | None = None,
                       sink: str | None = None) -> str | None:
    """The ``--base-url`` the ledger recorded for ``run_key``, or for the run last loaded
    into ``sink`` (a sink identity); None when the ledger does not know it. One read of
    the ledger."""
    if not os.path.exists(ledger_path):
        return None
    from adapters.ledger import Ledger

    ledger = Ledger(ledger_path)
    try:
        key = run_key or (ledger.last_loaded_run(sink) if sink else None)
        return None if key is None else str(ledger.run_settings(key).get("base_url") or "") or None
    except KeyError:
        return None
    finally:
        ledger.close()


def _embed_queries(queries: list[str], *, embedder: str, model: str, dimensions: int | None,
                   base_url: str | None, ledger: str) -> Any:  # fmt: skip
    """The queries' vectors (float32, len(queries) × d), one request or one model call.

    :raises InputError: openai vectors whose server is unknown (see
        ``_refuse_an_unknown_server``).
    """
    from adapters.embeddings import build_embedder, close_embedders
    from embedline.keys import request_key, text_sha256
    from embedline.settings import LOCAL_DIMENSIONS, RunSettings

    fields: dict[str, Any] = {"input": "-", "embedder": embedder, "model": model}
    if embedder == "openai" and not base_url:
        _refuse_an_unknown_server(ledger)
    if embedder == "openai":
        fields["dimensions"] = dimensions
        if base_url:
            fields["base_url"] = base_url
    elif dimensions not in (None, LOCAL_DIMENSIONS):
        fields["dimensions"] = dimensions
    client = build_embedder(RunSettings(**fields))
    try:
        key = request_key([text_sha256(q) for q in queries])
        return client.embed(queries, idempotency_key=key).vectors
    finally:
        close_embedders()


def _refuse_an_unknown_server(ledger: str) -> None:
    """Openai vectors, no ``--base-url``, and no ledger record of the run's: the query would
    go to OpenAI's API, which without a key refuses it (a break test waited 11 s of retries
    for exit 3, the vectors having come from a local server). With a key, OpenAI's API it is.

    :raises InputError: no key is set either.
    """
    from adapters.embeddings import api_key_from_env
    from embedline.errors import InputError

    if api_key_from_env() is None:
        raise InputError(f"which server embedded these vectors is unknown: the ledger {ledger} "
                         "has no record of their run; pass --ledger (the one the run used) or "
                         "--base-url (its server)")  # fmt: skip


def search_target(target: str, queries: list[str], *, k: int, run: str | None = None,
                  base_url: str | None = None,
                  ledger: str = DEFAULT_LEDGER) -> list[list[tuple[str, float]]]:  # fmt: skip
    """Embed ``queries`` like the target's vectors; return each one's ``k`` nearest ids as
    ``(id, cosine similarity)``, most similar first.

    :raises InputError: no committed run, no sink table, or a bad URI.
    :raises EmbedlineError: the embedder failed (see ``EmbeddingClient.embed``).
    """
    from embedline.errors import InputError

    if _is_sink(target):
        from adapters.sinks import open_sink

        sink = open_sink(target)
        try:
            info = sink.describe()
            if info is None:
                raise InputError(f"sink {sink.identity} has no table yet: load a run first")
            if info.model is None or info.embedder is None:
                raise InputError(f"sink {sink.identity} was not created by embedline: its "
                                 "model is unknown")  # fmt: skip
            base_url = base_url or _recorded_base_url(ledger, sink=sink.identity)
            vectors = _embed_queries(queries, embedder=info.embedder, model=info.model,
                                     dimensions=info.dimensions, base_url=base_url,
                                     ledger=ledger)  # fmt: skip
            return [sink.search(v, k) for v in vectors]
        finally:
            sink.close()
    import numpy as np

    from tasks.read import read_embeddings_arrow

    table = read_embeddings_arrow(target, run)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    manifest_embedder = _manifest_embedder(target, meta["embedline.run_key"])
    dims = int(meta["embedline.dimensions"])
    vectors = _embed_queries(queries, embedder=manifest_embedder, model=meta["embedline.model"],
                             dimensions=dims, ledger=ledger, base_url=base_url or
                             _recorded_base_url(ledger, run_key=meta["embedline.run_key"]))  # fmt: skip
    column = table.column("embedding").combine_chunks()
    matrix = np.asarray(column.flatten().to_numpy(zero_copy_only=False),
                        dtype=np.float32).reshape(len(column), dims)  # fmt: skip
    ids = table.column("id").to_pylist()
    return [top_k(matrix, ids, v, k) for v in vectors]


def _manifest_embedder(output: str, run_key: str) -> str:
    from adapters.object_store import open_store
    from embedline.models import manifest_object_key

    manifest = json.loads(open_store(output).get(manifest_object_key(run_key)))
    return str(manifest.get("embedder") or "local")


def _search(args: argparse.Namespace) -> int:
    from embedline.errors import EmbedlineError

    try:
        hits = search_target(args.target, [args.query], k=args.k, run=args.run,
                             base_url=args.base_url, ledger=args.ledger)[0]  # fmt: skip
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    except FileNotFoundError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    print(f"{'rank':>4}  {'score':>6}  id")
    for rank, (row_id, score) in enumerate(hits, 1):
        print(f"{rank:>4}  {score:6.3f}  {row_id}")
    return 0
