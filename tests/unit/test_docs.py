"""The documents stay what users need: short front door, present tense, links that resolve.

The README is the newcomer's five minutes; the guide and reference say what holds today;
measurements, dates, commit hashes and issue numbers live only in ``benchmarks/LOG.md``.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# embedline's own history: an ISO date, "HEAD abc1234", "issue 12" / "issue #12". Another
# project's bug report ("CPython gh-106883", "dask/distributed#8616") is a source, cited.
HISTORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bHEAD [0-9a-f]{7}|\b[Ii]ssues? #?\d+")
# A short commit hash: 7 to 12 hex digits holding both a digit and a letter. Longer keys
# (run keys, SHA-256 digests) are examples users need and are not matched.
SHORT_HASH = re.compile(
    r"(?<![0-9a-zA-Z_/-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}(?![0-9a-zA-Z_-])"
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SHIPPED = ("adapters", "tasks", "flows", "cli", "embedline", "deployments")
LIMITS = {"README.md": 150, "docs/design.md": 400, "benchmarks/README.md": 200}


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [REPO / line for line in out.stdout.splitlines() if (REPO / line).is_file()]


def _markdown() -> list[Path]:
    return [p for p in _tracked("*.md") if "node_modules" not in p.parts]


def _prose(text: str) -> str:
    """The text outside fenced code blocks (examples may show real keys and dates)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


@pytest.mark.parametrize("path,limit", sorted(LIMITS.items()))
def test_front_pages_stay_short(path: str, limit: int) -> None:
    lines = (REPO / path).read_text(encoding="utf-8").count("\n")
    assert lines <= limit, f"{path} has {lines} lines (at most {limit}): move detail to docs/"


def test_documents_carry_no_history_outside_the_log() -> None:
    found = []
    for md in _markdown():
        if md.relative_to(REPO).as_posix() == "benchmarks/LOG.md":
            continue
        text = _prose(md.read_text(encoding="utf-8"))
        # Inline code may show an example key's prefix; a hash in prose is history.
        no_code = re.sub(r"`[^`]*`", lambda m: "\n" * m.group(0).count("\n"), text)
        lines = zip(text.splitlines(), no_code.splitlines(), strict=True)
        for n, (line, bare) in enumerate(lines, 1):
            if HISTORY.search(line) or SHORT_HASH.search(bare):
                found.append(f"{md.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    where = "\n".join(found)
    assert not found, f"dates, hashes and issue numbers belong in benchmarks/LOG.md:\n{where}"


def test_shipped_code_carries_no_history() -> None:
    found = []
    for py in _tracked(*(f"{d}/*.py" for d in SHIPPED)):
        for n, line in enumerate(py.read_text(encoding="utf-8").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{py.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not found, "docstrings and comments say what holds today:\n" + "\n".join(found)


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a heading, for plain text."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(md: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", _prose(md.read_text("utf-8")), re.M)}


def test_every_relative_link_resolves() -> None:
    broken = []
    for md in _markdown():
        for target in LINK.findall(_prose(md.read_text(encoding="utf-8"))):
            if "://" in target or target.startswith(("mailto:", "<")):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            where = f"{md.relative_to(REPO)} -> {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_cli_reference_equals_run_help() -> None:
    spec = importlib.util.spec_from_file_location(
        "gen_cli_reference", REPO / "docs" / "gen_cli_reference.py"
    )
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.check(), (
        "docs/reference/cli.md differs from `embedline run --help`: run "
        "python docs/gen_cli_reference.py"
    )
