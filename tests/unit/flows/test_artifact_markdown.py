"""The summary and progress artifacts render as written in a GFM renderer: tables are
tables, and no number or message turns into a strikethrough (Prefect's UI reads ``~…~`` as
one: a summary showed ``~$0.0000 (~0 tokens …`` struck through)."""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

from embedline.models import DeadLetter
from embedline.progress import BatchCount, Progress, Usage
from embedline.summary import LoadSummary, RunSummary
from flows.artifacts import md_text, progress_markdown, summary_markdown

#: GFM's tables and strikethrough; linkify (the rest of "gfm-like") needs a package we lack
GFM = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_BARE_TILDE = re.compile(r"(?<!\\)~")  # GFM strikes through ~one~ as well as ~~two~~


def _assert_renders_as_written(markdown: str, tables: int) -> str:
    html = GFM.render(markdown)
    assert "<s>" not in html and "<del>" not in html, html
    assert html.count("<table>") == tables, html
    for line in markdown.splitlines():  # outside code spans, every ~ is escaped
        assert not _BARE_TILDE.search(re.sub(r"`[^`]*`", "", line)), line
    return html


def test_the_summary_renders_without_strikethrough_and_as_tables() -> None:
    load = LoadSummary(0, "loaded", "", sink="qdrant+local:///q", run_key="k" * 64, wall_s=1.0)
    summary = RunSummary(
        1,
        "incomplete",
        "stopped: ~2 of ~4 chunks | a *bold* _claim_",
        run_key="k" * 64,
        output="s3://b/out~1",
        tokens=0,
        rows_reused=3,
        tokens_saved=12,
        load=load.to_dict(),
    )
    dead = [DeadLetter(2, "id~1|x", "too_long", 400, 1)]
    markdown = summary_markdown(summary, dead_letters=dead, price_per_million_tokens=0.02)
    html = _assert_renders_as_written(markdown, tables=3)
    assert "~2 of ~4 chunks | a *bold* _claim_" in html  # literal, in one cell
    assert "<em>" not in html and "<strong>incomplete</strong>" in html


def test_the_progress_table_renders_without_strikethrough() -> None:
    event = Progress(
        rows_total=63_905,
        chunks_total=64,
        rows_done=12_000,
        chunks_done=3,
        rows_skipped=0,
        dead_letters=0,
        chunks_failed=0,
        batches=(BatchCount("in_progress", 2, 4_000, 1_200),),
    )
    markdown = progress_markdown(
        event,
        rows_per_s=5_210.4,
        eta_s=10.0,
        usage=Usage(requests=64, tokens=3_377_136, inputs=60_581, requests_retried=2),
        stages=(("load", "~0 of 10 rows"), ("index", "-")),
    )
    html = _assert_renders_as_written(markdown, tables=1)
    for cell in (
        "<td>12,000 of 63,905 (18.8 %)</td>",
        "<td>5,210 (last 60 s)</td>",
        "<td>10 s</td>",
        "<td>64 sent, 2 without vectors (rate limited, server errors, timeouts, refusals: not "
        "charged)</td>",
        "<td>60,581 texts answered with vectors, 3,377,136 tokens reported</td>",
        "<td>2 in_progress (1,200 of 4,000 requests done)</td>",
        "<td>~0 of 10 rows</td>",
    ):
        assert cell in html, html


def test_md_text_escapes_what_gfm_would_read_as_markup() -> None:
    assert md_text("~$0.0000 (~0 tokens") == r"\~$0.0000 (\~0 tokens"
    assert md_text("a|b *c* _d_ `e` [f] <g> \\") == r"a\|b \*c\* \_d\_ \`e\` \[f\] \<g\> \\"
