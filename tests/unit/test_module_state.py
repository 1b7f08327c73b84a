"""No module of the shipped packages keeps mutable state of its own: no ``global``
rebinding, no module-level list, dict or set, no module-level object built by a call,
besides loggers and constants (UPPER_CASE names bound to immutable values, frozensets,
tuples, compiled regexes, ``ContextVar``s, locks). What one command or flow hands the next
goes in an object passed along (``flows.session``), not in a module slot.

Each module is imported (it must import cleanly) and its source inspected (AST).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.fixtures import REPO

PACKAGES = ("embedline", "adapters", "tasks", "flows", "cli")

#: Calls whose result a module may keep at top level: loggers, immutable or thread-safe
#: values, typing constructs.
ALLOWED_CALLS = frozenset(
    {
        "getLogger",
        "compile",
        "frozenset",
        "tuple",
        "ContextVar",
        "Lock",
        "RLock",
        "TypeVar",
        "ParamSpec",
        "NewType",
        "MappingProxyType",
        # immutable values computed once: numpy dtypes and scalars, Arrow schemas, UUIDs
        "dtype",
        "uint64",
        "schema",
        "UUID",
        "len",
        "str",
        "monotonic",
    }
)

#: (module, name): why the module keeps it: a constant table never written, or state that
#: belongs to the process (signals, caches of clients shared by its threads, its exit).
ALLOWED: dict[tuple[str, str], str] = {
    ("embedline", "_LAZY"): "lazy-import table (PEP 562 __getattr__), never written",
    ("embedline.settings", "DEFAULT_MODELS"): "constant table, never written",
    ("embedline.settings", "PARAMETER_FIELDS"): "constant table, never written",
    ("embedline.settings", "_BOUNDS"): "constant table, never written",
    ("embedline.template", "_CLI_ESCAPES"): "constant table, never written",
    ("embedline.parameters", "SourceParameters"): "frozen model class of RunSettings' fields",
    ("embedline.parameters", "EmbeddingParameters"): "frozen model class of RunSettings' fields",
    ("embedline.parameters", "LimitParameters"): "frozen model class of RunSettings' fields",
    ("embedline.parameters", "DestinationParameters"): "frozen model class of RunSettings' fields",
    ("embedline.parameters", "BatchModeParameters"): "frozen model class of RunSettings' fields",
    ("adapters", "_MODULES"): "lazy-import table (PEP 562 __getattr__), never written",
    ("adapters.csv_format", "_UTF16_BOMS"): "constant table, never written",
    ("adapters.csv_format", "_CODE_PAGES"): "constant table, never written",
    ("adapters.sinks.pg_errors", "REASONS"): "constant table, never written",
    ("adapters.sinks.qdrant", "_RETRYABLE_STATUS"): "constant set, never written",
    ("tasks", "_HOMES"): "lazy-import table (PEP 562 __getattr__), never written",
    (
        "tasks.commit.changes",
        "_KEY_COLUMNS",
    ): "constant column list pyarrow takes as a list, never written",
    ("tasks.gc.retention", "_UNIT_S"): "constant table, never written",
    (
        "tasks.commit.sorted_spills",
        "_SORT_KEY",
    ): "constant sort key pyarrow takes as a list, never written",
    ("cli.local_server", "_SKIP_BLOCK_REGISTRATION"): "constant settings table, never written",
    ("cli.prefect_env", "_PREFECT_DEFAULTS"): "constant settings table, never written",
    (
        "embedline.tracebacks",
        "_FILTER",
    ): "a logging filter installed once per process; holds no state",
    (
        "embedline.tracebacks",
        "_CHUNK_STATE_FILTER",
    ): "a logging filter installed once per process; holds no state",
    (
        "flows.embed_csv",
        "_REWORD",
    ): "a logging filter installed once per process; holds no state",
    (
        "embedline.shutdown",
        "STOP",
    ): "the process's signal and stop state: signals are per process",
    (
        "embedline.exit_cleanups",
        "_exit_cleanups",
    ): "what a hard exit of the process must still run: per process, like atexit",
    (
        "embedline.progress",
        "_listener",
    ): "the process's progress listener: chunk threads report to it",
    ("embedline.progress", "_partial"): "per-process tally of chunk threads' partial progress",
    (
        "embedline.progress",
        "_cost",
    ): "per-process tally of requests and tokens the chunk threads sent",
    (
        "adapters.embeddings.factory",
        "_embedders",
    ): "HTTP clients shared by a process's chunk threads (closed by close_embedders)",
    ("adapters.embeddings.factory", "_warned_no_key"): "warn once per process",
    (
        "adapters.embeddings.factory",
        "_batch_clients",
    ): "Batch API clients shared by a process's threads (closed by close_embedders)",
    (
        "adapters.embeddings.local",
        "_local_model",
    ): "the local model, loaded once per process (hundreds of MB)",
    (
        "adapters.input_source",
        "_INDEXES",
    ): "per-process cache of gzip seek indexes, bounded, under a lock",
    (
        "tasks.batch.outputs",
        "OUTPUTS",
    ): "per-process cache of packed batches' result files split by chunk, bounded, locked",
    (
        "adapters.ledger.base",
        "_open",
    ): "weak registry of open ledger connections, closed at a hard exit",
    ("adapters.memory", "_done"): "the allocator is set up once per process",
    ("adapters.memory", "_libc"): "the C library handle, loaded once per process",
    ("adapters.memory", "_planning"): "the allocator's planning mode, per process",
    ("adapters.scratch", "_live"): "scratch directories to delete at the process's exit",
    (
        "tasks.load.task",
        "_SINKS",
    ): "per-process cache of open sink connections for load-chunk tasks",
    (
        "tasks.publish.chunk_object",
        "_checked_stores",
    ): "stores checked for conditional writes, once per process",
    (
        "tasks.reuse.chunk_side",
        "_failed_objects",
    ): "objects a process's reads found broken, not read again",
    (
        "tasks.embed.task",
        "_EARLIER_ATTEMPTS",
    ): "outcomes of a group task run's attempt, for its retry in the same process",
    ("cli", "_entered"): "the CLI's entry guard: one command per process entry",
    ("cli", "_exit_code"): "the exit code the process's exit handler returns",
    ("cli.console", "_active"): "the progress bar on the terminal now (one terminal per process)",
    (
        "cli.prefect_env",
        "_temporary_server_stopped",
    ): "the process's temporary Prefect server, stopped once",
    ("cli.prefect_console", "_CONSOLE_GATE"): "closes Prefect's console output once per process",
}


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "__main__.py":
                continue  # running it is the CLI
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _callee(node: ast.expr) -> str:
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Subscript):
        return _callee(func.value)
    return ast.unparse(func)


def _mutable(value: ast.expr | None) -> str | None:
    """What makes ``value`` module state, or None."""
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return type(value).__name__.lower()
    if isinstance(value, ast.Call) and _callee(value) not in ALLOWED_CALLS:
        return f"{_callee(value)}(...)"
    return None


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, through ``if``/``try``/``with`` blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            yield from _top_level(node.body)
            yield from _top_level(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)
            yield from _top_level(getattr(node, "finalbody", []))


def _findings(module: str, path: Path) -> Iterator[tuple[str, str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                yield module, name, "rebound with `global`"
    for node in _top_level(tree.body):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        why = _mutable(value)
        if why is None:
            continue
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name) and name.id not in ("__all__", "logger", "log"):
                    yield module, name.id, why


def test_no_module_keeps_mutable_state() -> None:
    found = []
    for module, path in _modules():
        importlib.import_module(module)
        found += [f for f in _findings(module, path) if (f[0], f[1]) not in ALLOWED]
    assert not found, "\n".join(f"{m}.{n}: {why}" for m, n, why in found)


def test_every_allowed_entry_still_exists() -> None:
    """An allow-list entry whose module no longer keeps the name is removed."""
    every = {(m, n) for module, path in _modules() for m, n, _ in _findings(module, path)}
    assert set(ALLOWED) <= every, set(ALLOWED) - every
