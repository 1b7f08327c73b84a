"""CLI pieces that need no process: argument errors and TSV output of dead letters."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import main
from cli.inspect import tsv_field


def test_dead_letter_ids_stay_onetsv_field() -> None:
    assert tsv_field("plain-id") == "plain-id"
    assert tsv_field("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--chunk-size", "0"), ("--progress-interval", "-1"), ("--progress-interval", "inf")],
)
def test_bad_numbers_are_usage_errors(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "x.csv", flag, value])
    assert info.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "x.csv", "--batch-size", "0"], "--batch-size: must be a whole number, at least 1"),
        (
            ["run", "x.csv", "--chunk-size", "x"],
            "--chunk-size: must be a whole number, at least 1, got 'x'",
        ),
        (["run", "x.csv", "--max-delete-fraction", "2"], "--max-delete-fraction: must be a number"),
        (["run", "x.csv", "--embedder", "foo"], "invalid choice: 'foo'"),
        (["run"], "required: INPUT"),
        (["gc"], "required: OUTPUT"),
        (["rnu"], "invalid choice: 'rnu'"),
        (["status", "--bogus"], "unrecognized arguments: --bogus"),
        (["run", "x.csv", "extra"], "embedline run: error: unrecognized arguments: extra"),
        (["status", "a", "b"], "embedline status: error: unrecognized arguments: b"),
        # abbreviations are refused: they would change meaning when an option is added
        (["run", "x.csv", "--dim", "64"], "embedline run: error: unrecognized arguments: --dim"),
        (["gc", "out", "--gra", "1h"], "embedline gc: error: unrecognized arguments: --gra"),
        # ... named before anything else argparse would say, with what they may mean
        (
            ["load", "abcdef12", "--t", "x"],
            "unrecognized arguments: --t (options are written in full: --to)",
        ),
        (["run", "--he"], "embedline run: error: unrecognized arguments: --he"),
        (
            ["--vers"],
            "embedline: error: unrecognized arguments: --vers (options are written in "
            "full: --version)",
        ),
    ],
)
def test_every_usage_error_is_one_line_that_points_to_help(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("embedline") and words in err, err
    assert err.rstrip().endswith("--help')"), err


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--grace", "-1"], "--grace: must be a finite number, 0 or more, got -1"),
        (["--grace", "nan"], "--grace: must be a finite number, 0 or more, got nan"),
        (["--chunk-retries", "-1"], "--chunk-retries: must be a whole number, 0 or more, got -1"),
        (["--batch-size", "2049"], "--batch-size: must be at most 2048, got 2049"),
        (["--max-attempts", "101"], "--max-attempts: must be at most 100, got 101"),
        (["--chunk-retries", "11"], "--chunk-retries: must be at most 10, got 11"),
    ],
)
def test_a_settings_error_names_the_flag_not_the_field(
    capsys: pytest.CaptureFixture[str], argv: list[str], problem: str
) -> None:
    """Bounds that only the settings know (OpenAI's 2048 inputs) read like argparse's."""
    with pytest.raises(SystemExit) as info:
        main(["run", "x.csv", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "_s:" not in err and problem in err, err
    assert err.startswith("embedline run: error: argument --"), err
    assert err.rstrip().endswith("(see 'embedline run --help')"), err


@pytest.mark.parametrize(
    ("url", "temporary", "chosen", "kept"),
    [
        ("http://127.0.0.1:4200/api", True, None, False),  # the CLI's own server
        ("http://127.0.0.1:4200/api", True, "60", False),  # ... runs no automations
        ("http://prefect.internal:4200/api", False, None, False),  # Prefect's default
        ("http://prefect.internal:4200/api", False, "60", True),  # the user chose them
        ("https://api.prefect.cloud/api/accounts/a/workspaces/w", False, None, True),
    ],
)
def test_flow_heartbeats_only_where_something_uses_them(
    monkeypatch: pytest.MonkeyPatch, url: str, temporary: bool, chosen: str | None, kept: bool
) -> None:
    """Prefect joins the heartbeat thread at the end of every flow run (up to 1 s); they feed
    only the zombie-run automation: Prefect Cloud's, or one the user set up (and then set
    the frequency, as Prefect's guide says)."""
    from types import SimpleNamespace

    from prefect.settings import get_current_settings

    from cli.run import _no_heartbeats

    monkeypatch.delenv("PREFECT_RUNNER_HEARTBEAT_FREQUENCY", raising=False)
    if chosen is None:
        monkeypatch.delenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", raising=False)
    else:
        monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", chosen)
    from prefect.settings import temporary_settings

    with temporary_settings():  # settings read again from the environment set above
        before = get_current_settings().flows.heartbeat_frequency
        with _no_heartbeats(SimpleNamespace(url=url, server=object() if temporary else None)):
            during = get_current_settings().flows.heartbeat_frequency
    assert before == (180 if chosen is None else int(chosen))
    assert during == (before if kept else None)


def test_the_summarys_chunk_counts_add_up_after_released_chunks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After a stop, released chunks are listed too (before: 0 + 0 + 37 + 22 of 64)."""
    import re

    from cli.console import print_summary
    from embedline.summary import RunSummary

    summary = RunSummary(
        130,
        "interrupted",
        "interrupted by SIGINT",
        run_key="k" * 64,
        output="out",
        rows_total=640,
        chunks_total=64,
        chunks_published=3,
        chunks_skipped=2,
        chunks_failed=37,
        chunks_released=5,
        chunks_not_run=17,
    )
    print_summary(summary.to_dict())
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("chunks"))
    assert "5 released" in line, line
    *parts, total = (int(n) for n in re.findall(r"\d+", line))
    assert sum(parts) == total == 64, line


def test_a_run_with_no_chunk_to_write_says_so_not_of_0(capsys: pytest.CaptureFixture[str]) -> None:
    """A delta night that only removes rows commits without a chunk: its line read
    "0 published now, 0 skipped, 0 failed, 0 not run, of 0"."""
    from cli.console import print_summary
    from embedline.summary import RunSummary

    fields = dict(run_key="k" * 64, output="out", rows_total=5, delta_base="b" * 64)
    print_summary(RunSummary(0, "complete", "", chunks_total=0, **fields).to_dict())
    print_summary(
        RunSummary(0, "complete", "", chunks_total=2, chunks_published=2, **fields).to_dict()
    )
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("chunks")]
    assert lines == [
        "chunks     none to write",
        "chunks     2 published now, 0 skipped, 0 failed, 0 not run, of 2",
    ]


def test_the_summary_gives_the_whole_commands_time_beside_the_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The flow's wall time leaves out Prefect's start-up (0.3 s printed for a 5.6 s
    command); both are printed, the whole command's only when it differs."""
    from cli.console import print_summary
    from embedline.summary import RunSummary

    summary = RunSummary(0, "complete", "", run_key="k" * 64, output="out", wall_s=4.7)
    print_summary(summary.to_dict(), command_s=9.84)
    print_summary(summary.to_dict())
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("wall time")]
    assert lines == [
        "wall time  4.7 s (the whole command: 9.8 s, with Prefect's start-up)",
        "wall time  4.7 s",
    ]


def test_an_already_complete_reruns_changes_line_says_it_is_the_earlier_commits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A rerun of a committed run prints that run's change set; it read "(first run on this
    output)" as if this command had just made the first run."""
    from cli.console import print_summary
    from embedline.summary import RunSummary

    fields = dict(
        run_key="k" * 64,
        output="out",
        rows_added=3,
        rows_changed=0,
        rows_removed=0,
        rows_unchanged=0,
    )
    print_summary(RunSummary(0, "already_complete", "nothing to do", **fields).to_dict())
    print_summary(RunSummary(0, "complete", "", **fields).to_dict())
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("changes")]
    first = "(first run of this dataset on this output; as committed earlier)"
    assert lines[0].endswith(first), lines
    assert lines[1].endswith("(first run of this dataset on this output)"), lines


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"embedline {version('embedline')}"


def test_chunk_index_ranges_for_the_same_error_line() -> None:
    from flows.dispatch import _ranges

    assert _ranges([7, 0, 3, 2, 4]) == "chunks 0, 2-4, 7"
    assert _ranges([5]) == "chunks 5"


def test_prefects_final_state_line_of_a_chunk_task_is_dropped_unless_debugging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatcher logs each chunk's outcome; Prefect's ERROR "Finished in state
    Failed(…)" for the same task run repeated it (two ERROR lines per failed chunk)."""
    import logging

    from embedline.tracebacks import DEBUG_ENV, ChunkFinalStateFilter

    def record(msg: str, level: int = logging.ERROR, task: str = "embed-chunk") -> bool:
        rec = logging.LogRecord("prefect.task_runs", level, __file__, 1, msg, None, None)
        rec.task_name = task
        return ChunkFinalStateFilter().filter(rec)

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert not record("Finished in state Failed('Task run encountered an exception …')")
    assert record("Finished in state Failed('…')", task="load-chunk")  # other tasks keep it
    assert record("Finished in state Completed()", level=logging.INFO)
    assert not record("Task run failed with exception: RetryableError('…') - Retries are exhausted")
    assert record(
        "Task run failed with exception: boom - Retry 1/1 will start 10 second(s) from now",
        level=logging.INFO,
    )
    assert record("Task run failed with exception: boom", task="load-chunk")
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert record("Finished in state Failed('…')")


def test_the_api_line_counts_in_the_singular_and_says_when_the_model_ran_in_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It read "1 inputs sent", and "api 0 requests, 249 inputs sent" for the local model;
    the texts of retried requests are not counted as charged."""
    from cli.console import print_summary
    from embedline.summary import RunSummary

    base = dict(run_key="k" * 64, output="out")
    print_summary(RunSummary(0, "complete", "", requests=1, inputs=1, tokens=1, **base).to_dict())
    print_summary(RunSummary(0, "complete", "", requests=0, inputs=249, **base).to_dict())
    print_summary(RunSummary(0, "complete", "", requests=0, inputs=0, **base).to_dict())
    # committed before: nothing was asked of the API or of a local model
    print_summary(RunSummary(0, "already_complete", "", requests=0, inputs=0, **base).to_dict())
    # Batch API mode: the texts batches answered were sent, not embedded in-process
    print_summary(
        RunSummary(
            0,
            "complete",
            "",
            requests=0,
            inputs=10,
            batch_inputs=10,
            tokens=50,
            batch_tokens=50,
            batches=3,
            **base,
        ).to_dict()
    )
    lines = [
        x
        for x in capsys.readouterr().out.splitlines()
        if x.startswith(("api", "model", "embedder"))
    ]
    assert lines == [
        "api        1 request, 1 input charged, 1 token reported",
        "model      249 inputs embedded in-process (no API requests)",
        "api        0 requests, 0 inputs charged, 0 tokens reported",
        "embedder   nothing embedded: the run was committed before",
        "api        0 requests, 10 inputs charged (10 of them in Batch API batches), "
        "50 tokens reported",
    ]
    retried = RunSummary(
        0, "complete", "", requests=904, requests_retried=18, inputs_retried=18_000, **base
    )
    print_summary(retried.to_dict())
    assert capsys.readouterr().out.splitlines()[4] == (
        "api        904 requests (18 without vectors: 18,000 texts not charged), 0 inputs charged, "
        "0 tokens reported"
    )


@pytest.mark.parametrize("query", ["", "   ", "\t"])
def test_a_blank_search_query_is_a_usage_error_before_any_request(
    query: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was sent and came back as the server's 400, exit 1."""
    with pytest.raises(SystemExit) as info:
        main(["search", "some-output", query])
    assert info.value.code == 2
    assert "QUERY" in capsys.readouterr().err


def test_every_option_of_every_command_has_help_and_says_its_default() -> None:
    """The second break test found ``load --ledger`` and ``search --ledger`` with no help
    text, ``search --k`` without its default (10), and ``gc --ledger`` not saying which
    file it reads. Every option now has help, and every default is shown, in its own words
    where it is None (never "(default: None)")."""
    import argparse

    from cli.main import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in commands.choices.items():
        text = " ".join(parser.format_help().split())
        assert "default: None" not in text, name
        for action in parser._actions:
            if (
                not action.option_strings
                or action.help == argparse.SUPPRESS
                or isinstance(action, argparse._HelpAction)
            ):
                continue
            assert action.help, (name, action.option_strings)
            if action.default not in (None, argparse.SUPPRESS):
                assert (
                    " ".join(parser._get_formatter()._get_help_string(action).split()).endswith(
                        "(default: %(default)s)"
                    )
                    or "(default:" in action.help
                ), (name, action.option_strings)


def test_an_interrupted_batch_runs_summary_still_counts_its_batches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.console import print_summary
    from embedline.summary import RunSummary

    print_summary(
        RunSummary(
            143,
            "interrupted",
            "interrupted by SIGTERM",
            run_key="k" * 64,
            output="out",
            batches=5,
            price_per_million_tokens=0.02,
        ).to_dict()
    )
    assert "batch      5 Batch API batches, 0 tokens at the batch price (half)\n" in (
        capsys.readouterr().out
    )


def test_one_batch_is_said_in_the_singular(capsys):
    from cli.console import cost_lines

    assert cost_lines({"batches": 1, "batch_tokens": 7}) == [
        "batch      1 Batch API batch, 7 tokens at the batch price (half)"
    ]


@pytest.mark.parametrize("where", ["missing", "empty", "a file's sibling"])
def test_gc_on_a_path_that_holds_no_output_says_so_instead_of_deleting_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    target = tmp_path / "out"
    if where == "empty":
        target.mkdir()
    elif where == "a file's sibling":  # a typo next to a real output
        (tmp_path / "outs" / "manifests").mkdir(parents=True)
        (tmp_path / "outs" / "manifests" / "x.json").write_text("{}")
    assert main(["gc", str(target), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(target) in err and "holds no embedline output" in err


@pytest.mark.parametrize(
    ("flag", "value"), [("--grace", "x"), ("--older-than", "5q"), ("--grace", "")]
)
def test_gc_ages_that_do_not_parse_name_their_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    assert main(["gc", str(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"embedline gc: error: argument {flag}: not an age"), err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["gc", "OUT", "--grace", "-1h"], "argument --grace: an age is 0 or more, got '-1h'"),
        (["gc", "OUT", "--older-than", "-2d"], "argument --older-than: an age is 0 or more"),
        (["run", "x.csv", "--grace", "-1"], "argument --grace: must be a finite number, 0 or more"),
        (["run", "x.csv", "--chunk-retry-delay", "-1.5"], "argument --chunk-retry-delay:"),
        (["run", "x.csv", "--timeout", "-inf"], "argument --timeout: must be a finite number"),
        (["gc", "OUT", "--grace", "-inf"], "argument --grace: an age is 0 or more"),
        (["gc", "OUT", "--grace", "--dry-run"], "argument --grace: expected one argument"),
    ],
)
def test_a_negative_value_reaches_its_options_own_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    """argparse takes only a plain negative number as a value: ``--grace -1h`` answered
    "expected one argument", as if the value were missing."""
    argv = [str(tmp_path) if a == "OUT" else a for a in argv]
    try:
        code = main(argv)  # gc checks its ages itself; argparse's checks exit
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert "expected one argument" not in err or "--dry-run" in argv, err


def test_a_value_that_starts_with_a_minus_is_taken_as_written() -> None:
    from cli.main import _parser

    args = _parser().parse_args(
        ["run", "x.csv", "--id-column", "-id", "--text-template", "-{title}"]
    )
    assert (args.id_column, args.text_template) == ("-id", "-{title}")


@pytest.mark.parametrize(
    "sink",
    ["foo://x", "lancedb://./db?tabel=t", "postgresql://a:s3cret@h/db", "qdrant://s3cret@h/x"],
)
def test_dead_letters_with_a_bad_sink_is_one_line_and_exit_2(
    sink: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was a traceback and exit 1, before the ledger was even read."""
    assert main(["dead-letters", "abc", "--sink", sink, "--ledger", str(tmp_path / "l")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("embedline: error: ") and err.count("\n") == 1, err
    assert "s3cret" not in err and not (tmp_path / "l").exists()


def test_a_delta_night_that_keeps_nothing_says_none_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It read "3,001 rows written, 0 kept in the objects of run …"."""
    from cli.console import print_summary
    from embedline.summary import RunSummary

    fields = dict(run_key="k" * 64, output="out", delta_base="b" * 64, chunks_total=1)
    print_summary(RunSummary(0, "complete", "", rows_published=3001, **fields).to_dict())
    print_summary(
        RunSummary(0, "complete", "", rows_published=5, rows_inherited=4, **fields).to_dict()
    )
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("delta")]
    assert lines == [
        f"delta      3,001 rows written, none kept from run {'b' * 12} (a delta night)",
        f"delta      1 rows written, 4 kept in the objects of run {'b' * 12} (a delta night)",
    ]


@pytest.mark.parametrize(("code", "prefix"), [(3, "embedline: error: "), (143, "embedline: ")])
def test_a_loads_last_line_says_error_unless_interrupted(
    code: int, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.load import print_load_summary

    print_load_summary({"sink": "s", "exit_code": code, "message": "it stopped"})
    assert capsys.readouterr().err == f"{prefix}it stopped\n"
