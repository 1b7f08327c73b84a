"""``embedline search TARGET "query" [--k 10] [--where COLUMN=VALUE …] [--columns A,B]``: the
nearest ids to a query, by cosine similarity.

TARGET is a run's output root (searches the latest committed run's published vectors, or
``--run``) or a sink URI (LanceDB, pgvector or Qdrant). The query is embedded with the embedder and
model that made the vectors: the run's manifest says which, or the sink table's metadata.
Each line is ``rank score id`` and then the run's kept columns (``--keep-columns``), so
scripts that read the first three fields keep working; the kept text is not printed unless
``--columns`` names it. ``--where COLUMN=VALUE`` (repeatable, all must hold) keeps only the
rows whose ``id`` or kept column equals VALUE exactly, and the hits are the true k nearest
among those (each store's ``search(where=…)``; on an output root the rows are filtered, then
scored exactly). A column the target does not have is an input error (exit 2) before any
query is embedded. ``--exact`` scores every (matching) row instead of searching through an
approximate index (pgvector's HNSW, a Qdrant server's graph, a LanceDB index someone built);
an output root is always searched that way. ``embedline recall`` (``cli/recall.py``) measures
how far the two differ.

The embedder, model and server of the query are those of the run that made the vectors,
whichever way TARGET names them: an output root's run (its manifest, and the ledger's
record of its ``--base-url``), a sink table (its metadata, and the run last loaded into it),
or a cutover alias (the same for the table it points at: ``loaded_identity``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

from cli.arguments import HELP_FORMATTER, positive_int
from cli.failures import EXIT_USAGE, fail
from cli.run_options import DEFAULT_LEDGER

__all__ = ["add_parsers", "kept_columns", "search_target", "top_k"]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``search``."""
    search = sub.add_parser(
        "search", help="ids nearest to a query (cosine similarity)", formatter_class=HELP_FORMATTER
    )
    search.add_argument(
        "target",
        metavar="TARGET",
        help="an output root (directory or s3://), or a sink URI "
        "(lancedb://PATH, PATH/NAME.lance, postgresql://…, "
        "qdrant://HOST:PORT/COLLECTION, qdrant+local://PATH)",
    )
    search.add_argument(
        "query", metavar="QUERY", type=_query, help="the text to search for (not blank)"
    )
    search.add_argument("--k", type=positive_int, default=10, help="results to print")
    search.add_argument(
        "--run", default=None, help="with an output root: a run key or prefix (default: the latest)"
    )
    search.add_argument(
        "--base-url",
        default=None,
        help="for openai vectors: the API root (default: the run's recorded "
        "--base-url in --ledger, else OpenAI's if a key is set)",
    )
    search.add_argument(
        "--where",
        metavar="COLUMN=VALUE",
        action="append",
        type=_where,
        default=[],
        help="only rows whose COLUMN (id or a kept column) is "
        "exactly VALUE; repeat for several (all must hold)",
    )
    search.add_argument(
        "--columns",
        metavar="A,B",
        type=_column_list,
        default=None,
        help="the kept columns to print after rank, score and id (default: "
        "all kept columns; the kept text only when named)",
    )
    search.add_argument(
        "--exact",
        action="store_true",
        help="score every (matching) row: the true k nearest, never through an "
        "approximate index (slower on a large table; an output root is always exact)",
    )
    search.add_argument(
        "--ledger",
        default=DEFAULT_LEDGER,
        help="the ledger `run` wrote (relative to the current directory): "
        "which --base-url embedded the run's vectors",
    )
    search.set_defaults(handler=_search, resumable=False)


def _query(text: str) -> str:
    """argparse type: a query with some non-blank text (a blank one is never sent: the
    API refuses it, and an embedding of nothing ranks nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is blank: give the text to search for")
    return text


def _where(text: str) -> tuple[str, str]:
    """argparse type: ``COLUMN=VALUE`` split at the first ``=`` (VALUE may hold ``=``)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            "is not COLUMN=VALUE: give a column name, '=', and the value it must equal"
        )
    return name, value


def _column_list(text: str) -> tuple[str, ...]:
    """argparse type: ``A,B`` → ``("A", "B")`` (names as in the CSV, spaces kept)."""
    names = tuple(n for n in text.split(",") if n)
    if not names:
        raise argparse.ArgumentTypeError("names no column: give A,B")
    return names


def top_k(
    matrix: Any, ids: list[str], vector: Any, k: int, values: Sequence[list[Any]] = ()
) -> list[tuple[Any, ...]]:
    """The ``k`` rows of ``matrix`` (float32, rows × d) most cosine-similar to ``vector``
    (d,), as ``(id, similarity, *values)``, most similar first; ``values`` are columns
    (one list per column, a value per row) returned beside each hit
    (``adapters.sinks.base.exact_top_k``)."""
    from adapters.sinks.base import exact_top_k

    return exact_top_k(matrix, ids, vector, k, values)


def _is_sink(target: str) -> bool:
    from adapters.sinks import is_sink_uri

    return is_sink_uri(target)


def _recorded_base_url(
    ledger_path: str, *, run_key: str | None = None, sink: str | None = None
) -> str | None:
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


def _embed_queries(
    queries: list[str],
    *,
    embedder: str,
    model: str,
    dimensions: int | None,
    base_url: str | None,
    ledger: str,
) -> Any:
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
    go to OpenAI's API, which without a key refuses it after seconds of retries (exit 3),
    though the vectors may well have come from a local server. With a key, OpenAI's API it is.

    :raises InputError: no key is set either.
    """
    from adapters.embeddings import api_key_from_env
    from embedline.errors import InputError

    if api_key_from_env() is None:
        raise InputError(
            f"which server embedded these vectors is unknown: the ledger {ledger} "
            "has no record of their run; pass --ledger (the one the run used) or "
            "--base-url (its server)"
        )


def search_target(
    target: str,
    queries: list[str],
    *,
    k: int,
    run: str | None = None,
    base_url: str | None = None,
    ledger: str = DEFAULT_LEDGER,
    columns: bool | Sequence[str] = False,
    where: Sequence[tuple[str, str]] = (),
    exact: bool = False,
) -> list[list[tuple[Any, ...]]]:
    """Embed ``queries`` like the target's vectors; return each one's ``k`` nearest ids as
    ``(id, cosine similarity)``, most similar first, among the rows meeting ``where``
    (``(column, value)`` pairs, exact string equality, all must hold); with ``columns``
    (True: the target's kept columns, ``kept_columns``; or a sequence of its column names),
    each hit is followed by those columns' values. ``exact``: a sink scores every matching
    row (``VectorSink.search``); an output root always does.

    :raises InputError: no committed run, no sink table, a bad URI, or a ``where`` or
        ``columns`` name the target lacks (before any query is embedded).
    :raises EmbedlineError: the embedder failed (see ``EmbeddingClient.embed``).
    """
    from embedline.errors import InputError

    if _is_sink(target):
        from adapters.sinks import open_sink
        from adapters.sinks.factory import loaded_identity

        sink = open_sink(target)
        try:
            info = sink.describe()
            if info is None:
                raise InputError(f"sink {sink.identity} has no table yet: load a run first")
            if info.model is None or info.embedder is None:
                raise InputError(
                    f"sink {sink.identity} was not created by embedline: its model is unknown"
                )
            shown = _shown(target, ("id", *info.columns.names), info.columns.kept, columns, where)
            base_url = base_url or _recorded_base_url(ledger, sink=loaded_identity(target, sink))
            vectors = _embed_queries(
                queries,
                embedder=info.embedder,
                model=info.model,
                dimensions=info.dimensions,
                base_url=base_url,
                ledger=ledger,
            )
            return [
                sink.search(v, k, columns=shown, where=tuple(where), exact=exact) for v in vectors
            ]
        finally:
            sink.close()
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from tasks.load.read_run import read_embeddings_arrow

    table = read_embeddings_arrow(target, run)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    known = ("id", *(n for n in table.column_names if n not in ("id", "embedding", "text_sha256")))
    shown = _shown(
        target, known, kept_columns(target, run) if columns is True else (), columns, where
    )
    for name, value in where:  # the published rows that match, then an exact search
        table = table.filter(pc.equal(table.column(name), pa.scalar(value, pa.string())))
    manifest_embedder = _manifest_embedder(target, meta["embedline.run_key"])
    dims = int(meta["embedline.dimensions"])
    vectors = _embed_queries(
        queries,
        embedder=manifest_embedder,
        model=meta["embedline.model"],
        dimensions=dims,
        ledger=ledger,
        base_url=base_url or _recorded_base_url(ledger, run_key=meta["embedline.run_key"]),
    )
    column = table.column("embedding").combine_chunks()
    matrix = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(
        len(column), dims
    )
    ids = table.column("id").to_pylist()
    values = [table.column(c).to_pylist() for c in shown]
    return [top_k(matrix, ids, v, k, values) for v in vectors]


def _shown(
    target: str,
    known: Sequence[str],
    kept: Sequence[str],
    columns: bool | Sequence[str],
    where: Sequence[tuple[str, str]],
) -> tuple[str, ...]:
    """The columns to return beside each hit (``kept`` for True, none for False); refuse a
    ``where`` or ``columns`` name not in ``known`` (``id`` and the target's kept columns).

    :raises InputError: naming the column and listing ``known``.
    """
    from embedline.errors import InputError

    shown = tuple(kept) if columns is True else () if columns is False else tuple(columns)
    for name, flag in [(n, "--where") for n, _ in where] + [(n, "--columns") for n in shown]:
        if name not in known or (flag == "--columns" and name == "id"):
            raise InputError(
                f"{flag} names column {name!r}, which {target} does not have; "
                f"its columns: {', '.join(known)}",
                column=name,
            )
    return shown


def kept_columns(target: str, run: str | None = None) -> tuple[str, ...]:
    """The kept columns (``--keep-columns``) of ``target``: a sink's table or the run of an
    output root (default: the latest); none when it keeps none."""
    if _is_sink(target):
        from adapters.sinks import open_sink

        sink = open_sink(target)
        try:
            info = sink.describe()
        finally:
            sink.close()
        return info.columns.kept if info is not None else ()
    from adapters.object_store import open_store
    from tasks.load.read_run import resolve_run

    manifest = resolve_run(open_store(target), run)
    return tuple(str(c) for c in manifest.get("kept_columns") or ())


def _manifest_embedder(output: str, run_key: str) -> str:
    from adapters.object_store import open_store
    from embedline.models import manifest_object_key

    manifest = json.loads(open_store(output).get(manifest_object_key(run_key)))
    return str(manifest.get("embedder") or "local")


def _search(args: argparse.Namespace) -> int:
    from embedline.errors import EmbedlineError

    try:
        names = args.columns if args.columns is not None else kept_columns(args.target, args.run)
        hits = search_target(
            args.target,
            [args.query],
            k=args.k,
            run=args.run,
            base_url=args.base_url,
            ledger=args.ledger,
            columns=names,
            where=args.where,
            exact=args.exact,
        )[0]
    except EmbedlineError as exc:
        return fail(f"embedline: error: {exc}", exc.exit_code)
    except FileNotFoundError as exc:
        return fail(f"embedline: error: {exc}", EXIT_USAGE)
    if not hits:  # nothing matched --where (or an empty target): nothing to print
        return 0
    width = max([len(str(h[0])) for h in hits] + [2]) if names else 0
    print(
        f"{'rank':>4}  {'score':>6}  "
        + (f"{'id':<{width}}  " + "  ".join(names) if names else "id")
    )
    for rank, (row_id, score, *values) in enumerate(hits, 1):
        shown = "  ".join(_one_line(v) for v in values)
        print(
            f"{rank:>4}  {score:6.3f}  " + (f"{row_id:<{width}}  {shown}" if names else str(row_id))
        )
    return 0


def _one_line(value: Any) -> str:
    """A kept value on one output line: line breaks and tabs shown as spaces, null as ''."""
    if value is None:
        return ""
    return " ".join(str(value).split("\n")).replace("\r", " ").replace("\t", " ")
