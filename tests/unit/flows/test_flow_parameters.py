"""The flow's parameters as Prefect's UI shows them in the custom-run form: five sections
(pydantic-model parameters), each field with the CLI option's default, bounds, choices and
help."""

from __future__ import annotations

from typing import Any

from prefect.utilities.callables import parameter_schema

from embedline.parameters import GROUPS, grouped, parameter_defaults
from embedline.settings import option_description
from flows.embed_csv import embed_csv


def _schema() -> dict[str, Any]:
    return parameter_schema(embed_csv).model_dump_for_openapi()


def _section(schema: dict[str, Any], group: str) -> dict[str, Any]:
    ref = schema["properties"][group]["$ref"].removeprefix("#/definitions/")
    return dict(schema["definitions"][ref])


def test_the_form_has_one_section_per_group_in_order() -> None:
    schema = _schema()
    assert list(schema["properties"]) == [
        "source",
        "embedding",
        "limits",
        "destination",
        "batch_mode",
    ]
    assert schema["required"] == ["source"]  # the input has no default
    for position, (group, _, names) in enumerate(GROUPS):
        prop = schema["properties"][group]
        assert prop["position"] == position
        assert prop["description"].split(":")[0] in _section(schema, group)["description"]
        assert list(_section(schema, group)["properties"]) == list(names)


def test_section_defaults_are_the_cli_defaults() -> None:
    schema = _schema()
    defaults = parameter_defaults()
    for group, _, names in GROUPS:
        fields = _section(schema, group)["properties"]
        for name in names:
            if name == "input":
                assert "default" not in fields[name]
                continue
            assert fields[name]["default"] == defaults[name], name
        if group != "source":  # the section's own default: its fields' defaults
            assert schema["properties"][group]["default"] == {n: defaults[n] for n in names}
    limits = _section(schema, "limits")["properties"]
    assert limits["chunk_size"]["default"] == 1000
    assert limits["batch_size"] == {
        "default": 1000,
        "description": "rows per request (at most 2048, OpenAI's limit)",
        "maximum": 2048,
        "minimum": 1,
        "title": "Batch Size",
        "type": "integer",
    }
    assert limits["concurrency"]["default"] == 8


def test_choices_are_enums_in_the_custom_run_form() -> None:
    schema = _schema()
    assert _section(schema, "embedding")["properties"]["embedder"]["enum"] == ["local", "openai"]
    assert _section(schema, "limits")["properties"]["task_runner"]["enum"] == ["threads", "dask"]
    assert _section(schema, "embedding")["properties"]["on_too_long"]["enum"] == [
        "dead-letter",
        "truncate",
    ]
    assert _section(schema, "destination")["properties"]["on_empty_text"]["enum"] == [
        "skip",
        "fail",
    ]


def test_batch_options_are_unset_unless_given() -> None:
    fields = _section(_schema(), "batch_mode")["properties"]
    assert fields["batch_poll_interval"]["default"] is None
    assert fields["batch_poll_interval"]["description"] == (
        "with --batch-api: longest wait between two polls of the run's batches (the first "
        "polls come sooner) (default: 60.0)"
    )


def test_every_field_of_the_form_has_the_option_s_help_as_description() -> None:
    """The form says what each field does in the words of ``embedline run --help`` (both are
    ``RunFields``' descriptions); ``reuse`` in the field's own sense, since the flag is
    ``--no-reuse``."""
    schema = _schema()
    for group, _, names in GROUPS:
        fields = _section(schema, group)["properties"]
        for name in names:
            assert fields[name]["description"] == option_description(name), name
    reuse = _section(schema, "embedding")["properties"]["reuse"]["description"]
    assert reuse.startswith("copy the vector of a text already published")


def test_grouped_refuses_a_name_no_group_holds() -> None:
    import pytest

    assert grouped({"input": "a.csv", "chunk_size": 5}) == {
        "source": {"input": "a.csv"},
        "limits": {"chunk_size": 5},
    }
    with pytest.raises(ValueError, match="not a parameter of embed-csv: chunksize"):
        grouped({"chunksize": 5})


def test_the_prefect_reference_lists_each_section_s_fields() -> None:
    import re

    from tests.support.fixtures import REPO

    text = (REPO / "docs" / "reference" / "prefect.md").read_text(encoding="utf-8")
    for group, _, names in GROUPS:
        match = re.search(rf"^  - `{group}`: (.*?);?$(?=\n  - |\n\n)", text, flags=re.M | re.S)
        assert match, group
        assert re.findall(r"`(\w+)`", match.group(1)) == list(names), group
