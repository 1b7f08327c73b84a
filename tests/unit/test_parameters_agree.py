"""The run's parameters are declared twice: argparse in ``cli/run_options.py`` (which
``embedline --help`` reads without importing pydantic) and ``RunSettings``; the ``embed-csv``
flow's parameter groups are built from ``RunSettings``' fields (``embedline.parameters``), and
the deployments' ``prefect.yaml`` uses them. These tests fail when the CLI and the settings
disagree in name, default, choices or type, or a deployment names a parameter the flow lacks."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import yaml

from cli.run import add_parsers
from embedline.parameters import GROUPS, flattened, grouped, parameter_defaults
from embedline.settings import BATCH_API_OPTIONS, PARAMETER_FIELDS, RunSettings
from flows.embed_csv import embed_csv

# Options of the command only: they change how the CLI talks to the user, not the run.
CLI_ONLY = {"debug", "progress_interval"}
REPO = Path(__file__).resolve().parents[2]


def _run_actions() -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    return {a.dest: a for a in run._actions if a.dest not in ("help", *CLI_ONLY)}


_REQUIRED = object()


def _flow_parameters() -> dict[str, object]:
    """Each field of the flow's parameter groups: its default (``_REQUIRED``: none)."""
    hints = typing.get_type_hints(embed_csv.fn)
    fields: dict[str, object] = {}
    for group, _, _ in GROUPS:
        for name, info in hints[group].model_fields.items():
            fields[name] = _REQUIRED if info.is_required() else info.default
    return fields


def _flow_hints() -> dict[str, object]:
    hints = typing.get_type_hints(embed_csv.fn)
    return {
        name: info.annotation
        for group, _, _ in GROUPS
        for name, info in hints[group].model_fields.items()
    }


def _setting_default(name: str) -> object:
    field = RunSettings.model_fields[PARAMETER_FIELDS.get(name, name)]
    return field.default


def test_the_cli_the_flow_and_the_settings_name_the_same_parameters() -> None:
    cli = set(_run_actions())
    flow = set(_flow_parameters())
    settings = {
        next((k for k, v in PARAMETER_FIELDS.items() if v == f), f)
        for f in RunSettings.model_fields
    }
    assert cli == flow, f"only in the CLI: {cli - flow}; only in the flow: {flow - cli}"
    assert flow == settings, (
        f"only in the flow: {flow - settings}; only in RunSettings: {settings - flow}"
    )


def test_every_default_agrees() -> None:
    flow = _flow_parameters()
    for name, action in _run_actions().items():
        if name == "input":
            assert flow[name] is _REQUIRED
            continue
        if name in BATCH_API_OPTIONS:  # unset: absent (CLI), None (flow); refused if set
            # without --batch-api; the default is RunSettings', stated in the help
            assert action.default == argparse.SUPPRESS, f"--{name}"
            assert flow[name] is None, f"{name}: unset in the flow is None"
            default = _setting_default(name)
            assert default is None or f"(default: {default})" in str(action.help), f"--{name}"
            continue
        # SUPPRESS: the option is absent from the namespace unless given (``--no-reuse``)
        cli_default = flow[name] if action.default == argparse.SUPPRESS else action.default
        if action.default == argparse.SUPPRESS:
            assert isinstance(action, argparse._StoreFalseAction), f"--{name}"
            assert flow[name] is True, f"--{name}: a store_false flag of a True default"
        assert cli_default == flow[name], f"--{name}: CLI vs flow"
        assert flow[name] == _setting_default(name), f"{name}: flow vs RunSettings"
        assert parameter_defaults()[name] == flow[name], name


def test_every_choice_agrees() -> None:
    hints = _flow_hints()
    for name, action in _run_actions().items():
        hint = hints[name]
        candidates = (hint,) if typing.get_origin(hint) is typing.Literal else typing.get_args(hint)
        literal = [a for a in candidates if typing.get_origin(a) is typing.Literal]
        if action.choices is None:
            assert not literal, f"--{name}: the flow has choices {literal}, the CLI none"
            continue
        assert literal, f"--{name}: the CLI has choices, the flow's type is {hints[name]}"
        assert set(typing.get_args(literal[0])) == set(action.choices), f"--{name}"


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


def _base_type(hint: object) -> type:
    """``int`` of ``int | None``, ``str`` of ``Literal["a", "b"]``, else the type itself."""
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0])
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args:
        return _base_type(args[0])
    metadata_free = getattr(hint, "__origin__", hint)  # Annotated[int, ...] -> int
    assert isinstance(metadata_free, type), hint
    return metadata_free


def _cli_type(action: argparse.Action) -> type:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return bool
    if action.type is None:
        return str
    return type(action.type("1"))  # positive_int("1") -> int, fraction("1") -> float


def test_every_type_agrees() -> None:
    """``--chunk-size 2.5`` must fail in the CLI exactly when the flow's ``int`` would."""
    hints = _flow_hints()
    for name, action in _run_actions().items():
        flow_type = _base_type(hints[name])
        assert _cli_type(action) is flow_type, f"--{name}: CLI vs flow ({flow_type})"
        field = RunSettings.model_fields[PARAMETER_FIELDS.get(name, name)]
        assert _base_type(field.annotation) is flow_type, f"{name}: flow vs RunSettings"
