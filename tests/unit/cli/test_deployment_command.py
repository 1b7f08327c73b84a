"""``embedline deployment`` without a server: what it writes into prefect.yaml, what it keeps,
and what it refuses (the real deploy and run: tests/integration/test_deployment_command.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli import main
from embedline.parameters import GROUPS, flattened
from embedline.settings import RunSettings


def _write(tmp_path: Path, *argv: str) -> int:
    return main(["deployment", *argv, "--prefect-file", str(tmp_path / "prefect.yaml")])


def _deployments(tmp_path: Path) -> dict[str, dict[str, object]]:
    config = yaml.safe_load((tmp_path / "prefect.yaml").read_text())
    return {d["name"]: d for d in config["deployments"]}


def test_a_new_file_gets_the_sample_steps_and_only_the_options_given(tmp_path: Path) -> None:
    assert _write(tmp_path, "mine", "in.csv", "--chunk-size", "200", "--no-reuse") == 0
    config = yaml.safe_load((tmp_path / "prefect.yaml").read_text())
    assert config["build"][0]["prefect.deployments.steps.run_shell_script"]["id"] == "checkout"
    assert config["pull"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ checkout.stdout }}"}}
    ]
    (mine,) = config["deployments"]
    assert mine["entrypoint"] == "flows.embed_csv.embed_csv"
    assert mine["parameters"] == {
        "source": {"input": "in.csv"},
        "embedding": {"reuse": False},
        "limits": {"chunk_size": 200},
    }
    assert mine["schedules"] == []  # runs by hand: they wait for each other
    assert mine["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"}
    assert mine["work_pool"]["name"] == "embedline-local"


def test_the_parameters_give_back_the_settings_of_the_same_run_options(tmp_path: Path) -> None:
    argv = ["in.csv", "--text-template", "{title}\\n{text}", "--keep-columns", "title,section"]
    argv += ["--embedder", "openai", "--timeout", "5", "--batch-api", "--batch-max-inputs", "9"]
    argv += ["--output", "s3://bucket/prefix", "--sink", "lancedb://./db"]
    assert _write(tmp_path, "mine", *argv) == 0
    parameters = _deployments(tmp_path)["mine"]["parameters"]
    assert isinstance(parameters, dict)
    assert set(parameters) <= {group for group, _, _ in GROUPS}
    assert parameters["limits"] == {"timeout": 5.0}  # the option's name, not timeout_s
    assert RunSettings.from_parameters(flattened(parameters)) == RunSettings(
        input="in.csv",
        text_template="{title}\n{text}",
        keep_columns=("title", "section"),
        embedder="openai",
        timeout_s=5,
        batch_api=True,
        batch_max_inputs=9,
        output="s3://bucket/prefix",
        sink="lancedb://./db",
    )


def test_a_schedule_cancels_a_run_that_would_overlap(tmp_path: Path) -> None:
    argv = ["--cron", "30 2 * * *", "--timezone", "Europe/Berlin", "--work-pool", "p"]
    assert _write(tmp_path, "nightly", "in.csv", *argv) == 0
    assert _write(tmp_path, "hourly", "in.csv", "--interval", "3600") == 0
    found = _deployments(tmp_path)
    assert found["nightly"]["schedules"] == [
        {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "active": True}
    ]
    assert found["nightly"]["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}
    assert found["hourly"]["schedules"] == [{"interval": 3600, "active": True}]


def test_the_same_name_is_replaced_and_the_rest_of_the_file_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "prefect.yaml").write_text(
        "# my project\nname: mine\ndeployments:\n"
        "  - name: other # hand-written\n    entrypoint: x.py:f\n"
        "  - name: nightly\n    entrypoint: old.py:f\n"
    )
    assert _write(tmp_path, "nightly", "new.csv") == 0
    assert capsys.readouterr().out.startswith("replaced deployment embed-csv/nightly in ")
    text = (tmp_path / "prefect.yaml").read_text()
    assert text.startswith("# my project\n") and "# hand-written" in text
    found = _deployments(tmp_path)
    assert list(found) == ["other", "nightly"]
    assert found["nightly"]["parameters"] == {"source": {"input": "new.csv"}}


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--chunk-size", "0"], "argument --chunk-size: must be a whole number, at least 1"),
        (["--batch-fallback", "sync"], "argument --batch-fallback: needs --batch-api"),
        (["--keep-columns", "a,a"], "argument --keep-columns: column 'a' is named twice"),
        (["--max-cost", "1"], "--max-cost needs --price-per-million-tokens"),
        (["--cron", "* * * * *", "--interval", "60"], "not allowed with argument"),
        (["--timezone", "UTC"], "--timezone needs --cron or --interval"),
        (["--cron", "not a cron"], '--cron: Invalid cron string: "not a cron"'),
        (["--cron", "0 1 * * *", "--timezone", "Mars/Olympus"], "--timezone: Invalid timezone"),
        (["--interval", "60", "--timezone", "Mars/Olympus"], "--timezone: Invalid timezone"),
    ],
)
def test_what_run_refuses_is_refused_in_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    try:
        code = _write(tmp_path, "mine", "in.csv", *argv)
    except SystemExit as exc:
        code = int(str(exc.code))
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not (tmp_path / "prefect.yaml").exists()


def test_no_secret_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBEDLINE_API_KEY", "sk-secret-value")
    assert _write(tmp_path, "mine", "in.csv", "--embedder", "openai") == 0
    assert "sk-secret-value" not in (tmp_path / "prefect.yaml").read_text()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("foo: [1, 2\n", "not a prefect.yaml: not YAML (line 2)"),
        ("id,text\n1,a\n", "not a prefect.yaml (its top level is not a mapping)"),
        ("key: value: other\n", "not a prefect.yaml: not YAML (line 1)"),
    ],
    ids=["unclosed", "a-csv", "two-colons"],
)
def test_a_prefect_file_that_is_not_yaml_is_one_line_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str
) -> None:
    path = tmp_path / "prefect.yaml"
    path.write_text(text)
    assert _write(tmp_path, "mine", "in.csv") == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert path.read_text() == text


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("nightly/eu", "Prefect refuses / in a deployment's name"),
        ("a&b<c", "Prefect refuses & < in a deployment's name"),
        ("  ", "argument NAME: empty"),
    ],
    ids=["slash", "two-banned", "blank"],
)
def test_a_name_prefect_would_refuse_is_refused_here_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, words: str
) -> None:
    assert _write(tmp_path, name, "in.csv") == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not (tmp_path / "prefect.yaml").exists()


def test_the_next_command_is_quoted_for_a_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "my flows"
    folder.mkdir()
    path = folder / "prefect.yaml"
    assert main(["deployment", "catalogue nightly", "in.csv", "--prefect-file", str(path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("next: ") and last.endswith(
        f" --no-prompt deploy --prefect-file '{path}' --name 'catalogue nightly'"
    )


def test_the_next_command_names_the_prefect_beside_embedline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as .venv/bin/embedline (not activated), "prefect" is not on the shell's PATH."""
    import sys

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(Path(sys.executable).parent.parent.parent)  # the venv's parent
    assert (
        main(["deployment", "nightly", "in.csv", "--prefect-file", str(tmp_path / "p.yaml")]) == 0
    )
    last = capsys.readouterr().out.splitlines()[-1]
    venv = Path(sys.executable).parent.parent.name
    assert last.startswith(f"next: {venv}/bin/prefect --no-prompt deploy"), last


def test_a_prefect_file_in_a_missing_folder_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "typo" / "prefect.yaml"
    assert main(["deployment", "mine", "in.csv", "--prefect-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"folder {tmp_path / 'typo'} does not exist" in err and err.count("\n") == 1, err
    assert not path.parent.exists()


def test_a_cluster_deployment_is_the_sample_s_cluster_address(tmp_path: Path) -> None:
    """``embedline deployment … --task-runner dask --dask-address …`` writes the parameters of
    deployments/prefect.yaml's ``cluster-address``, with the flow named by module (the
    cluster's workers import it by that name). No scheduler is contacted."""
    argv = ["s3://my-bucket/input/catalogue.csv", "--embedder", "openai", "--task-runner"]
    argv += ["dask", "--dask-address", "tcp://dask-scheduler:8786", "--concurrency", "8"]
    argv += ["--output", "s3://my-bucket/embeddings"]
    assert _write(tmp_path, "cluster-address", *argv) == 0
    mine = _deployments(tmp_path)["cluster-address"]
    repo = Path(__file__).resolve().parents[3]
    samples = yaml.safe_load((repo / "deployments" / "prefect.yaml").read_text())["deployments"]
    (sample,) = [d for d in samples if d["name"] == "cluster-address"]
    assert mine["entrypoint"] == sample["entrypoint"] == "flows.embed_csv.embed_csv"
    assert mine["work_pool"]["name"] == sample["work_pool"]["name"]
    defaults = RunSettings(input="x").to_parameters()
    assert flattened(mine["parameters"]) == {
        name: value
        for name, value in flattened(sample["parameters"]).items()
        if name == "input" or value != defaults.get(name)  # the sample spells out its ledger
    }


def test_a_cluster_class_deployment_carries_its_kwargs_and_refuses_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["in.csv", "--output", "s3://b/o", "--task-runner", "dask"]
    argv += ["--dask-cluster-class", "coiled.Cluster"]
    assert _write(tmp_path, "c", *argv, "--dask-cluster-kwargs", '{"n_workers": 4}') == 0
    limits = _deployments(tmp_path)["c"]["parameters"]["limits"]
    assert limits == {
        "task_runner": "dask",
        "dask_cluster_class": "coiled.Cluster",
        "dask_cluster_kwargs": {"n_workers": 4},
    }
    capsys.readouterr()
    secret = '{"n_workers": 4, "token": "tok-123"}'
    with pytest.raises(SystemExit) as refused:
        _write(tmp_path, "s", *argv, "--dask-cluster-kwargs", secret)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "'token' looks like a secret" in err and "tok-123" not in err
    assert err.count("\n") == 1, err
    assert "tok-123" not in (tmp_path / "prefect.yaml").read_text()
