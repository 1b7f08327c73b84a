"""Text templates, kept columns and their keys (docs/reference/keys.md): parsing, escapes,
settings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from adapters.csv_source import plan_csv
from embedline import keys
from embedline.settings import RunSettings
from embedline.template import (
    TemplateError,
    kept_sha256,
    parse_template,
    placeholder,
    unescape_cli,
)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_placeholders_compose_the_text_with_literal_braces() -> None:
    template = parse_template("{{{title}}}\n\n{text} {{json}} {title}")
    assert template.columns == ("title", "text")
    assert template.compose({"title": "T", "text": "X"}) == "{T}\n\nX {json} T"
    assert parse_template("{a.b[0]:>9}").columns == ("a.b[0]:>9",)  # a name, not a format


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("{title", "never closed"),
        ("title}", "single '}'"),
        ("{}", "empty '{}'"),
        ("plain text", "names no column"),
        ("{a{b}", "inside the placeholder"),
    ],
)
def test_a_malformed_template_says_what_is_wrong(source: str, said: str) -> None:
    with pytest.raises(TemplateError, match=said):
        parse_template(source)


def test_the_command_line_escapes_are_newline_tab_and_backslash_only() -> None:
    assert unescape_cli(r"{title}\n\n{text}\t.") == "{title}\n\n{text}\t."
    assert unescape_cli(r"a\\nb \x \d") == "a\\nb \\x \\d"


def test_kept_sha256_is_of_the_json_array_of_the_values() -> None:
    values = ["Ünïcode", "a,b", ""]
    body = json.dumps(values, ensure_ascii=False, separators=(",", ":"))
    assert kept_sha256(values) == _sha(body)
    assert kept_sha256(["a", "b"]) != kept_sha256(["ab", ""])


def _key_lines(settings: RunSettings, tmp_path: Path) -> list[str]:
    """The documents lines of a run with ``settings`` (its plan's source), on a small file."""
    path = tmp_path / "x.csv"
    path.write_text("id,title,section,text,body\n1,a,b,c,d\n", encoding="utf-8")
    plan = plan_csv(path, **{**settings.plan_arguments, "scratch_root": None})
    return plan.source.key_lines


def test_plain_runs_keep_their_keys_and_documents_runs_get_lines(tmp_path: Path) -> None:
    plain = RunSettings(input="x.csv")
    assert _key_lines(plain, tmp_path) == []
    assert keys.run_key("abc", "id", "text", "m", None, 1000, columns=[]) == _sha(
        "\n".join(["run.v1", "abc", "id", "text", "m", "", "1000"])
    )
    docs = RunSettings(
        input="x.csv",
        text_template="{title}\n\n{text}",
        keep_columns="title, section",
        keep_text=True,
    )
    assert docs.kept_columns == ("title", "section")
    lines = ['template:"{title}\\n\\n{text}"', 'keep:["title", "section"]', "keep_text"]
    assert _key_lines(docs, tmp_path) == lines
    assert keys.run_key("abc", "id", "text", "m", None, 1000, generation=1, columns=lines) == _sha(
        "\n".join(["run.v1", "abc", "id", "text", "m", "", "1000", *lines, "g1"])
    )


def test_the_chunk_key_covers_kept_values_only_with_kept_columns() -> None:
    t = _sha("x")
    lines = ['keep:["title"]']
    k = kept_sha256(["T"])
    assert keys.chunk_key("m", None, [("1", t, k)], lines) == _sha(
        "\n".join(["chunk.v1", "m", "", *lines, f"1\x1f{t}\x1f{k}"])
    )
    assert keys.chunk_key("m", None, [("1", t, kept_sha256(["T2"]))], lines) != keys.chunk_key(
        "m", None, [("1", t, k)], lines
    )
    expected = _sha("\n".join(["chunk.v1", "m", "", f"1\x1f{t}"]))
    assert keys.chunk_key("m", None, [("1", t)]) == expected


def test_a_template_of_one_placeholder_is_the_text_column(tmp_path: Path) -> None:
    settings = RunSettings(input="x.csv", text_template="{body}")
    assert (settings.text_template, settings.text_column) == (None, "body")
    assert _key_lines(settings, tmp_path) == []
    assert placeholder("body") == "{body}"


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"text_template": "{title"}, "never closed"),
        ({"keep_columns": "title,,text"}, "empty column name"),
        ({"keep_columns": "title,title"}, "named twice"),
        ({"keep_columns": "embedding"}, "embedline's own columns"),
        ({"keep_columns": "run_key"}, "embedline's own columns"),
        ({"keep_columns": "title,text", "keep_text": True}, "--keep-text"),
    ],
)
def test_settings_refuse_bad_templates_and_kept_columns(
    fields: dict[str, object], said: str
) -> None:
    with pytest.raises(ValidationError, match=said):
        RunSettings(input="x.csv", **fields)


def test_kept_columns_round_trip_through_flow_parameters() -> None:
    settings = RunSettings(
        input="x.csv", keep_columns=["title"], keep_text=True, text_template="{title}: {text}"
    )
    assert RunSettings.from_parameters(settings.to_parameters()) == settings
