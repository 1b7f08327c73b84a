"""``embedline/`` is the pure core (docs/design.md, "Layout"): it installs no signal handler,
never ends the process, and does no file or network I/O when imported. The handlers and the
hard exit belong to the layers that own the process (``cli``, ``flows``).

An AST scan of each module: the calls named below, anywhere in it, and I/O calls in the code
that runs at import (module and class bodies, decorators, default values; not function
bodies)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MODULES = sorted((REPO / "embedline").rglob("*.py"))

#: Calls that install a signal handler, send a signal, or end the process.
PROCESS_CALLS = {"signal.signal", "signal.pthread_kill", "os._exit", "sys.exit", "os.kill"}
#: The same, however imported (``from os import _exit``) or built in (``exit()``).
PROCESS_NAMES = {"pthread_kill", "_exit", "exit", "quit", "killpg"}
#: Calls that read or write a file or talk to the network.
IO_NAMES = {
    "open",
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "mkdir",
    "makedirs",
    "touch",
    "unlink",
    "remove",
    "rmtree",
    "listdir",
    "scandir",
    "iterdir",
    "glob",
    "rglob",
    "stat",
    "exists",
    "connect",
    "create_connection",
    "getaddrinfo",
    "urlopen",
    "request",
    "get",
    "post",
    "put",
    "client",
    "resource",
    "run",
    "Popen",
    "check_output",
}
#: Modules whose every call is I/O.
IO_MODULES = {"socket", "urllib", "http", "httpx", "requests", "boto3", "sqlite3", "subprocess"}


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for a call's function, "" for anything that is not a name chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def _last(node: ast.expr) -> str:
    """The called name itself: ``read_text`` for ``Path(p).read_text``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _root(node: ast.expr) -> str:
    """The name a call's chain starts from: ``socket`` for ``socket.socket().connect``."""
    while isinstance(node, ast.Attribute | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    yield from (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def _run_at_import(tree: ast.Module) -> Iterator[ast.Call]:
    """The calls of the code that runs when the module is imported."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defaults = [d for d in node.args.kw_defaults if d is not None]
            todo += [*node.decorator_list, *node.args.defaults, *defaults]
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Call):
            yield node
        todo += list(ast.iter_child_nodes(node))


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_the_core_installs_no_handler_and_never_exits(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for call in _calls(tree):
        name = _dotted(call.func)
        if name in PROCESS_CALLS or name.rpartition(".")[2] in PROCESS_NAMES:
            found.append(f"line {call.lineno}: {name}()")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in {"signal", "os", "sys"}:
            names = {alias.name for alias in node.names}
            if names & ({"signal"} | PROCESS_NAMES):
                found.append(f"line {node.lineno}: from {node.module} import {sorted(names)}")
    assert found == [], f"{_name(path)} handles signals or exits the process: {found}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_the_core_does_no_io_at_import(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for call in _run_at_import(tree):
        if _last(call.func) in IO_NAMES or _root(call.func) in IO_MODULES:
            found.append(f"line {call.lineno}: {ast.unparse(call.func)}()")
    assert found == [], f"{_name(path)} does I/O when imported: {found}"


def test_the_scan_finds_what_it_looks_for() -> None:
    """The scan itself: each kind of call it forbids is found."""
    source = (
        "import os, signal\n"
        "signal.signal(signal.SIGINT, None)\n"
        "def f():\n"
        "    os._exit(1)\n"
        "    open('never at import')\n"
        "DATA = open('x').read()\n"
        "class C:\n"
        "    TEXT = Path('y').read_text()\n"
    )
    tree = ast.parse(source)
    process = [_dotted(c.func) for c in _calls(tree) if _dotted(c.func) in PROCESS_CALLS]
    at_import = [_last(c.func) for c in _run_at_import(tree)]
    assert process == ["signal.signal", "os._exit"]
    assert sorted(n for n in at_import if n in IO_NAMES) == ["open", "read_text"]
    assert _root(ast.parse("socket.socket().connect(a)").body[0].value.func) == "socket"  # type: ignore[attr-defined]
