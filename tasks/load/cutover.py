"""Model cutover without downtime (docs/reference/sinks.md): each model's run goes into a table of
its own, is checked, and only then a stable name (an alias) is switched to it in one step.

``embedline load RUN --to URI --alias NAME``: the run is loaded (the ordinary load, which
resumes and converges) into ``alias_table(NAME, model, dimensions)``; ``check_loaded``
compares the table with the manifest (rows, vector length, model); ``cut_over`` switches
NAME. ``--rollback`` points NAME back at the table it pointed at before. The tables are kept:
a rollback needs the previous one (drop old ones by hand once no rollback is wanted).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from adapters.sinks.factory import sink_uri_for_table
from embedline.errors import FatalError, InputError
from embedline.protocols import AliasState, AliasSwitch, VectorSink

__all__ = [
    "CutoverResult",
    "alias_table",
    "check_loaded",
    "cut_over",
    "cutover_target",
    "roll_back",
]

_MAX_NAME_BYTES = 63  # PostgreSQL's identifier limit, the tightest of the stores


@dataclass(frozen=True, slots=True)
class CutoverResult:
    """What a cutover or rollback did: ``alias`` now points at ``table``; ``previous`` is
    what it pointed at before (None: the alias is new); ``switched`` False when it pointed
    at ``table`` already."""

    alias: str
    table: str
    previous: str | None
    switched: bool


def alias_table(alias: str, model: str, dimensions: int) -> str:
    """The table a run of ``model`` (``dimensions`` floats) loads into behind ``alias``:
    ``{alias}__{model}_{dimensions}``, the model lowercased with every run of other
    characters than ``a-z0-9`` as one ``_`` (``text-embedding-3-small`` →
    ``text_embedding_3_small``); cut to 63 bytes with an 8-hex hash of the full name when
    longer, so two models never share a table."""
    slug = re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_") or "model"
    name = f"{alias}__{slug}_{dimensions}"
    if len(name.encode()) <= _MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name.encode()[: _MAX_NAME_BYTES - 9].decode(errors='ignore')}_{digest}"


def cutover_target(to: str, alias: str, manifest: dict[str, Any]) -> str:
    """The URI of the table ``manifest``'s run loads into behind ``alias`` in the store of
    ``to`` (``tasks.load.cutover.alias_table``).

    :raises InputError: the store has no aliases (LanceDB), or ``to`` is not a sink URI.
    """
    table = alias_table(alias, str(manifest["model"]), int(manifest["dimensions"]))
    return sink_uri_for_table(to, table)


def check_loaded(sink: VectorSink, manifest: dict[str, Any]) -> None:
    """Refuse to switch readers to ``sink``'s table unless it holds the manifest's run:
    ``rows_published`` rows, vectors of the manifest's ``dimensions`` and ``model``.

    :raises FatalError: naming the difference (exit 3: nothing was switched).
    """
    found = sink.describe()
    rows, dims = int(manifest["rows_published"]), int(manifest["dimensions"])
    model = str(manifest["model"])
    problems = []
    if found is None:
        problems.append("the table does not exist")
    else:
        if found.rows != rows:
            problems.append(f"it holds {found.rows:,} rows, the run {rows:,}")
        if found.dimensions != dims:
            problems.append(f"its vectors have {found.dimensions} floats, the run's {dims}")
        if found.model is not None and found.model != model:
            problems.append(f"its model is {found.model!r}, the run's {model!r}")
    if problems:
        raise FatalError(
            f"{sink.identity} is not ready for the cutover: "
            + "; ".join(problems)
            + "; the alias still points where it did"
        )


def cut_over(switch: AliasSwitch, table: str) -> CutoverResult:
    """Point ``switch``'s alias at ``table`` (checked by ``check_loaded`` first)."""
    before = switch.state()
    switch.switch(table)
    switched = before.current != table
    return CutoverResult(
        switch.alias, table, before.current if switched else before.previous, switched
    )


def roll_back(switch: AliasSwitch) -> CutoverResult:
    """Point the alias back at the table it pointed at before the last switch.

    :raises InputError: the alias does not exist, or was never switched.
    """
    state: AliasState = switch.state()
    if state.current is None:
        raise InputError(f"alias {switch.alias!r} does not exist: nothing to roll back")
    if state.previous is None:
        raise InputError(
            f"alias {switch.alias!r} was never switched (it points at "
            f"{state.current}): nothing to roll back to"
        )
    switch.switch(state.previous)
    return CutoverResult(switch.alias, state.previous, state.current, switched=True)
