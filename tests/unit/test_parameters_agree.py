"""The run's parameters are declared once, in ``embedline.run_fields.RunFields``: the CLI's
options come from the table generated from it (``cli/gen_run_options.py``, checked in
``tests/unit/cli/test_run_options.py``) and the ``embed-csv`` flow's parameter groups from its
fields (``embedline.parameters``). What can still disagree is tested here: the groups are
listed by hand (a new field must be placed in one), the CLI adds options of its own, and the
deployments' ``prefect.yaml`` names parameters the flow must have."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import yaml

from cli.run import settings_from
from embedline.parameters import GROUPS, flattened, grouped, parameter_defaults
from embedline.settings import MODE_OPTIONS, PARAMETER_FIELDS, RunSettings
from flows.embed_csv import embed_csv

# Options of the command only: they change how the CLI talks to the user, not the run.
CLI_ONLY = {"debug", "progress_interval"}
REPO = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    # imported here: importing the module cli.main rebinds ``cli.main``, the function other
    # test modules import from ``cli`` when they are collected
    from cli.main import _parser

    return _parser()


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    run: argparse.ArgumentParser = sub.choices["run"]
    return run


def _flow_parameters() -> dict[str, object]:
    """Each field of the flow's parameter groups: its default (``_REQUIRED``: none)."""
    hints = typing.get_type_hints(embed_csv.fn)
    fields: dict[str, object] = {}
    for group, _, _ in GROUPS:
        for name, info in hints[group].model_fields.items():
            fields[name] = _REQUIRED if info.is_required() else info.default
    return fields


_REQUIRED = object()


def test_the_cli_the_flow_and_the_settings_name_the_same_parameters() -> None:
    cli = {a.dest for a in _run_parser()._actions if a.dest not in ("help", *CLI_ONLY)}
    flow = set(_flow_parameters())
    settings = {
        next((k for k, v in PARAMETER_FIELDS.items() if v == f), f)
        for f in RunSettings.model_fields
    }
    assert cli == flow, f"only in the CLI: {cli - flow}; only in the flow: {flow - cli}"
    assert flow == settings, (
        f"only in the flow: {flow - settings}; only in RunSettings: {settings - flow}"
    )


def test_a_run_without_options_has_the_settings_and_the_flow_s_defaults() -> None:
    """``embedline run IN`` gives the settings' defaults (the options absent from the
    namespace unless given included), and the flow's groups hold the same defaults, the
    options only one mode reads unset."""
    args = _parser().parse_args(["run", "in.csv"])
    assert settings_from(args) == RunSettings(input="in.csv")
    for name in (*MODE_OPTIONS, "reuse"):
        assert name not in vars(args), f"--{name}: in the namespace although not given"
    flow = _flow_parameters()
    assert flow.pop("input") is _REQUIRED
    assert flow == parameter_defaults()
    defaults = RunSettings(input="in.csv").to_parameters()
    assert flow == {name: defaults[name] for name in flow}


def test_deployment_parameters_are_flow_parameters() -> None:
    """Each embed-csv deployment's parameters are the flow's groups, each holding only that
    group's fields, with values the group accepts."""
    config = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    hints = typing.get_type_hints(embed_csv.fn)
    for deployment in config["deployments"]:
        if not str(deployment.get("entrypoint", "")).endswith("embed_csv"):
            continue
        parameters = deployment.get("parameters") or {}
        assert set(parameters) <= {group for group, _, _ in GROUPS}, deployment["name"]
        for group, values in parameters.items():
            hints[group].model_validate(values)  # unknown names and bad values raise
        assert grouped(flattened(parameters)) == parameters, deployment["name"]
