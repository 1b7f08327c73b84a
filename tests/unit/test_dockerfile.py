"""The ``Dockerfile`` for a Dask cluster's workers and flow runs, checked offline: no Docker
daemon here, so what can be read is checked — it installs this package from the pinned
constraints with the extras the cluster guide names, it copies every package the install
ships, its command exists once installed, and the profiler setting it bakes in is one Dask
reads as off. Whether it builds is not checked here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guide" / "cluster.md"
INSTALL = re.compile(r"pip install -c constraints\.txt '\.\[([a-z,]+)\]'")


def _instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined, comments out."""
    text = (REPO / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for line in joined.splitlines()
        if (parts := line.strip().split(None, 1))
    ]


def _pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_it_installs_with_the_constraints_file_and_the_extras_the_guide_names() -> None:
    runs = " ".join(args for op, args in _instructions() if op == "RUN")
    (image_extras,) = INSTALL.findall(runs)
    assert set(INSTALL.findall(GUIDE.read_text())) == {image_extras}  # the guide says the same
    extras = _pyproject()["project"]["optional-dependencies"]  # type: ignore[index]
    assert "dask" in image_extras.split(",")
    assert set(image_extras.split(",")) <= set(extras)
    copied = {src for op, args in _instructions() if op == "COPY" for src in args.split()[:-1]}
    assert {"constraints.txt", "pyproject.toml", "README.md"} <= copied  # README: the metadata


def test_it_copies_every_package_the_install_ships() -> None:
    """A non-editable install ships ``[tool.setuptools] packages`` only: each must be copied,
    and each directory holding an ``__init__.py`` under them must be listed."""
    packages = set(_pyproject()["tool"]["setuptools"]["packages"])  # type: ignore[index]
    tops = {p.split(".")[0] for p in packages}
    copied = {
        args.split()[-1].removeprefix("./")
        for op, args in _instructions()
        if op == "COPY" and len(args.split()) == 2
    }
    assert tops <= copied
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in tops
        for init in (REPO / top).rglob("__init__.py")
    }
    assert on_disk == packages


def test_its_command_exists_once_installed() -> None:
    (cmd,) = [args for op, args in _instructions() if op == "CMD"]
    assert not [op for op, _ in _instructions() if op == "ENTRYPOINT"]
    program = shlex.split(cmd.strip("[]").replace(",", " "))[0]
    scripts = _pyproject()["project"]["scripts"]  # type: ignore[index]
    assert program in scripts
    # the worker's command of the guide comes with distributed, which the dask extra installs
    assert (Path(sys.executable).parent / "dask").exists()


def test_its_workers_start_without_the_profiler() -> None:
    env = dict(
        re.findall(r"(\w+)=(\S+)", " ".join(args for op, args in _instructions() if op == "ENV"))
    )
    setting = env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"]
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "import dask.config; print(dask.config.get('distributed.worker.profile.enabled'))",
        ],
        env={**os.environ, "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": setting},
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout.strip() == "False"
