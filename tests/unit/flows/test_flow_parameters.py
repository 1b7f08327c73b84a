"""The flow's parameters as Prefect's UI shows them in the custom-run form."""

from __future__ import annotations

from flows.embed_csv import embed_csv


def test_choices_are_enums_in_the_custom_run_form() -> None:
    properties = embed_csv.parameters.properties
    assert properties["embedder"]["enum"] == ["local", "openai"]
    assert properties["task_runner"]["enum"] == ["threads", "dask"]
    assert properties["on_too_long"]["enum"] == ["dead-letter", "truncate"]
    assert properties["on_empty_text"]["enum"] == ["skip", "fail"]
