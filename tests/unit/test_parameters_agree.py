"""The run's parameters are declared in three places (argparse in ``cli/run_options.py``, the
``embed-csv`` flow's signature, ``RunSettings``) and used in a fourth (the deployments'
``prefect.yaml``): these tests fail when they disagree in name, default or choices."""

from __future__ import annotations

import argparse
import inspect
import typing
from pathlib import Path

import yaml

from cli.run import add_parsers
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


def _flow_parameters() -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(embed_csv.fn).parameters)


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
            assert flow[name].default is inspect.Parameter.empty
            continue
        if name in BATCH_API_OPTIONS:  # unset: absent (CLI), None (flow); refused if set
            # without --batch-api; the default is RunSettings', stated in the help
            assert action.default == argparse.SUPPRESS, f"--{name}"
            assert flow[name].default is None, f"{name}: unset in the flow is None"
            default = _setting_default(name)
            assert default is None or f"(default: {default})" in str(action.help), f"--{name}"
            continue
        # SUPPRESS: the option is absent from the namespace unless given (``--no-reuse``)
        cli_default = flow[name].default if action.default == argparse.SUPPRESS else action.default
        if action.default == argparse.SUPPRESS:
            assert isinstance(action, argparse._StoreFalseAction), f"--{name}"
            assert flow[name].default is True, f"--{name}: a store_false flag of a True default"
        assert cli_default == flow[name].default, f"--{name}: CLI vs flow"
        assert flow[name].default == _setting_default(name), f"{name}: flow vs RunSettings"


def test_every_choice_agrees() -> None:
    hints = typing.get_type_hints(embed_csv.fn)
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
    config = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    flow = set(_flow_parameters())
    for deployment in config["deployments"]:
        if not str(deployment.get("entrypoint", "")).endswith(":embed_csv"):
            continue
        unknown = set(deployment.get("parameters") or {}) - flow
        assert not unknown, f"deployment {deployment['name']}: {unknown}"


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
    hints = typing.get_type_hints(embed_csv.fn)
    for name, action in _run_actions().items():
        flow_type = _base_type(hints[name])
        assert _cli_type(action) is flow_type, f"--{name}: CLI vs flow ({flow_type})"
        field = RunSettings.model_fields[PARAMETER_FIELDS.get(name, name)]
        assert _base_type(field.annotation) is flow_type, f"{name}: flow vs RunSettings"
