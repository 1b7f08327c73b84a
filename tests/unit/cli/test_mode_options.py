"""Options only one mode reads (``MODE_OPTIONS``: the Batch API's, Dask's) are refused when
given without their mode, in one line, exit 2, by the CLI and the flow alike: never ignored."""

from __future__ import annotations

import pytest

from cli import main
from embedline.settings import MODE_OPTIONS, RunSettings, options_without_their_mode


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--dask-workers", "4"], "argument --dask-workers: needs --task-runner dask"),
        (
            ["--dask-address", "tcp://10.0.0.5:8786"],
            "argument --dask-address: needs --task-runner dask",
        ),
        (["--batch-max-inputs", "100"], "argument --batch-max-inputs: needs --batch-api"),
        (
            [
                "--task-runner",
                "dask",
                "--dask-address",
                "tcp://h:8786",
                "--output",
                "s3://b/p",
                "--dask-workers",
                "2",
            ],
            "the cluster of --dask-address has its own workers (drop --dask-workers)",
        ),
        (
            [
                "--task-runner",
                "dask",
                "--dask-cluster-class",
                "distributed.LocalCluster",
                "--dask-workers",
                "3",
            ],
            "the cluster of --dask-cluster-class has its own workers (drop --dask-workers)",
        ),
        (
            ["--dask-cluster-kwargs", '{"n_workers": 2}'],
            "argument --dask-cluster-kwargs: needs --task-runner dask",
        ),
        (
            ["--task-runner", "dask", "--dask-address", "tcp://h:8786", "--output", "out"],
            "error: with --dask-address the chunk tasks run on other machines, which cannot "
            "write to the local directory 'out'",  # a rule of several options: no "argument"
        ),
    ],
    ids=[
        "workers-without-dask",
        "address-without-dask",
        "batch-without-batch-api",
        "workers-with-address",
        "workers-with-class",
        "kwargs-without-dask",
        "address-with-local-output",
    ],
)
def test_an_option_its_mode_would_not_read_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "in.csv", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


def test_the_flow_names_the_mode_each_option_needs() -> None:
    given = dict.fromkeys(MODE_OPTIONS, 1)
    assert {name for name, *_ in options_without_their_mode(given)} == set(MODE_OPTIONS)
    on = {**given, "batch_api": True, "task_runner": "dask"}
    assert options_without_their_mode(on) == []
    assert options_without_their_mode({"dask_workers": 3, "task_runner": "threads"}) == [
        ("dask_workers", "task_runner", "dask", "--task-runner dask")
    ]


@pytest.mark.parametrize(
    "settings",
    [
        RunSettings(input="in.csv"),
        RunSettings(input="in.csv", task_runner="dask", dask_workers=3),
        RunSettings(
            input="in.csv", task_runner="dask", dask_address="tcp://h:8786", output="s3://b/p"
        ),
    ],
    ids=["threads", "local-cluster", "cluster-by-address"],
)
def test_settings_give_back_parameters_the_flow_accepts(settings: RunSettings) -> None:
    parameters = settings.to_parameters()
    assert options_without_their_mode(parameters) == []
    assert RunSettings.from_parameters(parameters) == settings
